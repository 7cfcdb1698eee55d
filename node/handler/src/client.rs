//! Typed client of a launcher's command socket.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedReadHalf;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use virt_domain::protocol::{DomainEvent, Request, Response};

pub use crate::launcher_fs::CMD_SOCKET;
use crate::launcher_fs::LauncherDir;

/// Errors talking to a launcher.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Socket trouble.
    #[error("launcher socket {path}: {source}")]
    Io {
        /// Socket.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The launcher sent something that is not a [`Response`].
    #[error("launcher sent an invalid reply: {0}")]
    Decode(#[from] serde_json::Error),
    /// No reply in time.
    #[error("launcher did not answer within {0:?}")]
    Timeout(Duration),
    /// The launcher closed the connection.
    #[error("launcher closed the connection")]
    Closed,
    /// A line longer than [`MAX_LINE`]: the launcher is the tenant's, and virt-handler
    /// (one per node, serving every VM on it) must not grow with what one of them sends.
    #[error("launcher sent a line longer than {MAX_LINE} bytes")]
    TooLong,
}

/// The longest line read from a launcher. Its largest replies (a domain's status with
/// every interface and volume) are a few KiB.
pub const MAX_LINE: usize = 1024 * 1024;

/// Lines from a launcher, each at most [`MAX_LINE`] bytes.
type Lines = FramedRead<OwnedReadHalf, LinesCodec>;

/// The next line, `None` at the end of the stream.
async fn next_line(lines: &mut Lines) -> Result<Option<String>, ClientError> {
    match lines.next().await {
        None => Ok(None),
        Some(Ok(l)) => Ok(Some(l)),
        Some(Err(LinesCodecError::MaxLineLengthExceeded)) => Err(ClientError::TooLong),
        Some(Err(LinesCodecError::Io(source))) => Err(ClientError::Io {
            path: PathBuf::new(),
            source,
        }),
    }
}

/// A launcher's command socket.
#[derive(Clone, Debug)]
pub struct LauncherClient {
    dir: LauncherDir,
    socket: String,
    path: PathBuf,
    timeout: Duration,
}

/// Stream of domain events.
#[derive(Debug)]
pub struct Events {
    lines: Lines,
}

impl Events {
    /// The next event; `None` when the launcher closed the stream.
    pub async fn next(&mut self) -> Result<Option<DomainEvent>, ClientError> {
        loop {
            let Some(line) = next_line(&mut self.lines).await? else {
                return Ok(None);
            };
            if let Response::Event(ev) = serde_json::from_str(&line)? {
                return Ok(Some(ev));
            }
        }
    }
}

/// Stream of migration statuses (`watchMigration`).
#[derive(Debug)]
pub struct MigrationEvents {
    lines: Lines,
}

impl MigrationEvents {
    /// The next status; `None` when the launcher closed the stream.
    pub async fn next(
        &mut self,
    ) -> Result<Option<virt_domain::protocol::MigrationStatus>, ClientError> {
        loop {
            let Some(line) = next_line(&mut self.lines).await? else {
                return Ok(None);
            };
            if let Response::Migration(st) = serde_json::from_str(&line)? {
                return Ok(Some(st));
            }
        }
    }
}

impl LauncherClient {
    /// Client for the command socket in `dir`.
    pub fn new(dir: LauncherDir) -> Self {
        Self::at(dir, CMD_SOCKET)
    }

    /// Client for the socket `socket` in `dir`.
    pub fn at(dir: LauncherDir, socket: &str) -> Self {
        Self {
            path: PathBuf::from(dir.location().to_string()).join(socket),
            socket: socket.to_string(),
            dir,
            timeout: Duration::from_secs(20),
        }
    }

    /// The same client with another per-call timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The launcher's sockets directory.
    pub fn dir(&self) -> &LauncherDir {
        &self.dir
    }

    async fn open(
        &self,
        req: &Request,
    ) -> Result<(Lines, tokio::net::unix::OwnedWriteHalf), ClientError> {
        let io = |source| ClientError::Io {
            path: self.path.clone(),
            source,
        };
        let stream = self
            .dir
            .connect(&self.socket)
            .await
            .map_err(|e| ClientError::Io {
                path: self.path.clone(),
                source: e.into_io(),
            })?;
        let (r, mut w) = stream.into_split();
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        w.write_all(&line).await.map_err(io)?;
        Ok((
            FramedRead::new(r, LinesCodec::new_with_max_length(MAX_LINE)),
            w,
        ))
    }

    /// Sends one request and waits for its reply.
    pub async fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let fut = async {
            let (mut lines, _w) = self.open(req).await?;
            let line = next_line(&mut lines).await?.ok_or(ClientError::Closed)?;
            Ok(serde_json::from_str(&line)?)
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| ClientError::Timeout(self.timeout))?
    }

    /// Opens a stream with `req`, within the client's timeout (a launcher that accepts
    /// and never reads must not hold a handler task for ever).
    async fn open_stream(&self, req: &Request) -> Result<Lines, ClientError> {
        let (lines, _w) = tokio::time::timeout(self.timeout, self.open(req))
            .await
            .map_err(|_| ClientError::Timeout(self.timeout))??;
        Ok(lines)
    }

    /// Follows the launcher's outgoing migration (`watchMigration`).
    pub async fn watch_migration(&self) -> Result<MigrationEvents, ClientError> {
        Ok(MigrationEvents {
            lines: self.open_stream(&Request::WatchMigration).await?,
        })
    }

    /// Subscribes to domain events.
    pub async fn watch(&self) -> Result<Events, ClientError> {
        Ok(Events {
            lines: self.open_stream(&Request::Watch).await?,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::launcher_fs::Location;
    use tokio::io::AsyncReadExt;

    /// N4 of the security review at bd37f96: a launcher answering with an endless line is
    /// cut off at [`MAX_LINE`] with an error, the handler's memory not growing with it.
    #[tokio::test]
    async fn an_endless_line_from_a_launcher_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let l = tokio::net::UnixListener::bind(dir.path().join(CMD_SOCKET)).unwrap();
        let sent = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut req = [0u8; 256];
            let _ = s.read(&mut req).await;
            let chunk = vec![b'x'; 64 * 1024];
            let mut total = 0usize;
            // Writes until the reader gives up (a broken pipe), never a newline.
            while s.write_all(&chunk).await.is_ok() {
                total += chunk.len();
                if total > 64 * MAX_LINE {
                    break;
                }
            }
            total
        });
        let c = LauncherClient::new(LauncherDir::new(Location::Host(dir.path().to_path_buf())));
        let got = c.call(&Request::GetStatus).await;
        assert!(matches!(got, Err(ClientError::TooLong)), "{got:?}");
        let total = sent.await.unwrap();
        assert!(
            total < 4 * MAX_LINE,
            "the handler read {total} bytes of one line before giving up"
        );
    }
}
