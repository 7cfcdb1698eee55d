//! Typed client of a launcher's command socket.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::unix::OwnedReadHalf;
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
    lines: Lines<BufReader<OwnedReadHalf>>,
}

impl Events {
    /// The next event; `None` when the launcher closed the stream.
    pub async fn next(&mut self) -> Result<Option<DomainEvent>, ClientError> {
        loop {
            let Some(line) = self.lines.next_line().await.map_err(|e| ClientError::Io {
                path: PathBuf::new(),
                source: e,
            })?
            else {
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
    lines: Lines<BufReader<OwnedReadHalf>>,
}

impl MigrationEvents {
    /// The next status; `None` when the launcher closed the stream.
    pub async fn next(
        &mut self,
    ) -> Result<Option<virt_domain::protocol::MigrationStatus>, ClientError> {
        loop {
            let Some(line) = self.lines.next_line().await.map_err(|e| ClientError::Io {
                path: PathBuf::new(),
                source: e,
            })?
            else {
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

    /// The launcher's sockets directory.
    pub fn dir(&self) -> &LauncherDir {
        &self.dir
    }

    async fn open(
        &self,
        req: &Request,
    ) -> Result<
        (
            Lines<BufReader<OwnedReadHalf>>,
            tokio::net::unix::OwnedWriteHalf,
        ),
        ClientError,
    > {
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
        Ok((BufReader::new(r).lines(), w))
    }

    /// Sends one request and waits for its reply.
    pub async fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let fut = async {
            let (mut lines, _w) = self.open(req).await?;
            let line = lines
                .next_line()
                .await
                .map_err(|source| ClientError::Io {
                    path: self.path.clone(),
                    source,
                })?
                .ok_or(ClientError::Closed)?;
            Ok(serde_json::from_str(&line)?)
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| ClientError::Timeout(self.timeout))?
    }

    /// Follows the launcher's outgoing migration (`watchMigration`).
    pub async fn watch_migration(&self) -> Result<MigrationEvents, ClientError> {
        let (lines, _w) = self.open(&Request::WatchMigration).await?;
        Ok(MigrationEvents { lines })
    }

    /// Subscribes to domain events.
    pub async fn watch(&self) -> Result<Events, ClientError> {
        let (lines, _w) = self.open(&Request::Watch).await?;
        Ok(Events { lines })
    }
}
