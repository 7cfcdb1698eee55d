//! The launcher's command socket: virt-handler sends [`Request`]s, one JSON line each,
//! and gets one [`Response`] line back (or a stream of events after `watch`).

use std::path::{Path, PathBuf};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use virt_domain::protocol::{DomainEvent, DomainState, PROTOCOL_VERSION, Request, Response};

use crate::launcher::Running;

/// Serves the command socket at `path` until `stop` fires. A `shutdown` request
/// cancels `shutdown` (the launcher's own graceful-stop token).
pub async fn serve(
    path: PathBuf,
    running: Running,
    shutdown: CancellationToken,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    let guard = RemoveOnDrop(path);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => {
                let (stream, _) = accepted?;
                let (running, shutdown) = (running.clone(), shutdown.clone());
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, running, shutdown).await {
                        tracing::debug!(error = %e, "command connection ended");
                    }
                });
            }
        }
    }
    drop(guard);
    Ok(())
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn send(w: &mut (impl AsyncWriteExt + Unpin), r: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line).await
}

async fn connection(
    stream: UnixStream,
    running: Running,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Some(line) = lines.next_line().await? {
        let req: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                send(
                    &mut w,
                    &Response::Error {
                        message: format!("bad request: {e}"),
                    },
                )
                .await?;
                continue;
            }
        };
        let h = &running.handle;
        let done = |r: Result<(), crate::actor::LibvirtError>| match r {
            Ok(()) => Response::Ok,
            Err(e) => Response::Error {
                message: e.to_string(),
            },
        };
        let resp = match req {
            Request::Ping => Response::Pong {
                version: PROTOCOL_VERSION,
            },
            Request::GetStatus => Response::Status(running.status()),
            Request::Action(a) => done(h.act(a).await),
            Request::Kill => done(h.destroy().await),
            Request::Shutdown => {
                shutdown.cancel();
                Response::Ok
            }
            Request::Watch => return watch(&running, &mut w).await,
            Request::PrepareMigrationTarget if running.migration_target => {
                Response::MigrationTargetReady(running.paths.clone())
            }
            Request::PrepareMigrationTarget => Response::Error {
                message: "this launcher was not started with --migration-target".into(),
            },
            Request::Migrate(m) => {
                // A target that received its guest runs it like any launcher and may send
                // it on (migrating back); one still waiting has nothing to send.
                if running.migration_target
                    && running.handle.state().borrow().state == DomainState::Pending
                {
                    Response::Error {
                        message: "this migration target has not received the guest yet".into(),
                    }
                } else {
                    tracing::info!(target = ?m.target, options = ?m.options, "migrating");
                    done(h.migrate(running.migrate_job(&m.target, &m.options)).await)
                }
            }
            Request::CancelMigration => {
                tracing::info!("cancelling the migration");
                done(h.cancel_migration().await)
            }
            Request::WatchMigration => return watch_migration(&running, &mut w).await,
        };
        send(&mut w, &resp).await?;
    }
    Ok(())
}

/// Streams domain events derived from state transitions until the domain ends.
async fn watch(running: &Running, w: &mut (impl AsyncWriteExt + Unpin)) -> std::io::Result<()> {
    let mut rx = running.handle.state();
    let mut last = DomainState::Pending;
    // Only changes from here on: the subscriber reads the status on the first event
    // (`started` for a running guest), which carries the agent's state as it is.
    let mut last_agent = rx.borrow().agent_connected;
    loop {
        let o = rx.borrow_and_update().clone();
        if o.agent_connected != last_agent {
            last_agent = o.agent_connected;
            send(
                w,
                &Response::Event(DomainEvent::GuestAgent {
                    connected: o.agent_connected,
                }),
            )
            .await?;
        }
        let ev = match (last, o.state) {
            (a, b) if a == b => None,
            (DomainState::Paused, DomainState::Running) => Some(DomainEvent::Resumed),
            (_, DomainState::Running) => Some(DomainEvent::Started),
            (_, DomainState::Paused) => Some(DomainEvent::Paused),
            (_, DomainState::Shutoff) => Some(DomainEvent::ShutDown),
            (_, DomainState::Crashed) => Some(DomainEvent::Crashed {
                reason: o.reason.clone().unwrap_or_default(),
            }),
            (_, DomainState::Migrated) => Some(DomainEvent::Migrated),
            _ => None,
        };
        last = o.state;
        if let Some(ev) = ev {
            let end = matches!(
                ev,
                DomainEvent::ShutDown | DomainEvent::Crashed { .. } | DomainEvent::Migrated
            );
            send(w, &Response::Event(ev)).await?;
            if end {
                return Ok(());
            }
        }
        if rx.changed().await.is_err() {
            return Ok(());
        }
    }
}

/// Streams the outgoing migration's status until it is final (at once when no
/// migration was asked for: the current `idle` status, then the stream ends).
async fn watch_migration(
    running: &Running,
    w: &mut (impl AsyncWriteExt + Unpin),
) -> std::io::Result<()> {
    let mut rx = running.handle.migration();
    loop {
        let st = rx.borrow_and_update().clone();
        let end = st.is_final() || st == virt_domain::protocol::MigrationStatus::Idle;
        send(w, &Response::Migration(st)).await?;
        if end || rx.changed().await.is_err() {
            return Ok(());
        }
    }
}

/// Sends one request to a launcher's command socket and reads the reply.
pub async fn request(path: &Path, req: &Request) -> std::io::Result<Response> {
    let stream = UnixStream::connect(path).await?;
    let (r, mut w) = stream.into_split();
    let mut line = serde_json::to_vec(req).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line).await?;
    let mut lines = BufReader::new(r).lines();
    let reply = lines
        .next_line()
        .await?
        .ok_or_else(|| std::io::Error::other("launcher closed the connection"))?;
    serde_json::from_str(&reply).map_err(std::io::Error::other)
}
