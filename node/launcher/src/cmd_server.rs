//! The launcher's command socket: virt-handler sends [`Request`]s, one JSON line each,
//! and gets one [`Response`] line back (or a stream of events after `watch`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use virt_domain::protocol::{DomainEvent, DomainState, PROTOCOL_VERSION, Request, Response};
use virt_domain::stats::FileSystemStats;

use crate::launcher::Running;

/// How long reading the domain's statistics may take. virt-handler waits a little longer
/// for the answer, so a launcher's own timeout is what a hung QEMU runs into.
const STATS_TIMEOUT: Duration = Duration::from_secs(3);

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
            Request::GetStats => {
                let guest = h.guest().clone();
                let connected = h.state().borrow().agent_connected;
                if guest.claim_filesystems_refresh(connected) {
                    // Not waited for: a hung agent must not hold the scrape. It runs beside
                    // libvirt's statistics, so a prompt agent's answer usually makes this
                    // scrape; a late one serves the next.
                    let g = guest.clone();
                    drop(tokio::task::spawn_blocking(move || g.refresh_filesystems()));
                }
                match h.stats(STATS_TIMEOUT).await {
                    Ok(mut stats) => {
                        stats.filesystems = guest
                            .filesystems_for_metrics(connected)
                            .iter()
                            .map(FileSystemStats::from)
                            .collect();
                        Response::Stats {
                            stats: Box::new(stats),
                        }
                    }
                    Err(e) => Response::Error {
                        message: e.to_string(),
                    },
                }
            }
            Request::Action(a) => done(h.act(a).await),
            Request::GuestPing | Request::GuestExec(_) => {
                let guest = h.guest().clone();
                let connected = h.state().borrow().agent_connected;
                let exec = match req {
                    Request::GuestExec(e) => Some(e),
                    _ => None,
                };
                let run = move || {
                    let cmd =
                        exec.map(|e| (e.command, Duration::from_secs(e.timeout_seconds.into())));
                    guest.probe(cmd.as_ref().map(|(c, t)| (c.as_slice(), *t)), connected)
                };
                match tokio::task::spawn_blocking(run).await {
                    Ok(Ok(Some(r))) => Response::GuestExec(r),
                    Ok(Ok(None)) => Response::Ok,
                    Ok(Err(e)) => Response::Error {
                        message: e.to_string(),
                    },
                    Err(e) => Response::Error {
                        message: format!("guest agent task: {e}"),
                    },
                }
            }
            Request::Guest(q) => {
                let guest = h.guest().clone();
                let connected = h.state().borrow().agent_connected;
                match tokio::task::spawn_blocking(move || guest.answer(q, connected)).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => Response::Error {
                        message: e.to_string(),
                    },
                    Err(e) => Response::Error {
                        message: format!("guest agent task: {e}"),
                    },
                }
            }
            Request::Kill => done(h.destroy().await),
            Request::SetVcpus { vcpus } => done(h.set_vcpus(vcpus).await),
            Request::AttachVolume { disk, volume } => hotplugged(
                h.hotplug(crate::actor::HotplugOp::Attach { disk, volume })
                    .await,
            ),
            Request::DetachVolume { name } => {
                hotplugged(h.hotplug(crate::actor::HotplugOp::Detach(name)).await)
            }
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

fn hotplugged(
    r: Result<Vec<virt_domain::schema::HotpluggedDisk>, crate::actor::LibvirtError>,
) -> Response {
    match r {
        Ok(disks) => Response::Hotplugged { disks },
        Err(e) => Response::Error {
            message: e.to_string(),
        },
    }
}

/// Streams domain events derived from state transitions until the domain ends.
async fn watch(running: &Running, w: &mut (impl AsyncWriteExt + Unpin)) -> std::io::Result<()> {
    let mut guest = running.handle.guest().subscribe();
    guest.mark_unchanged();
    watch_events(running.handle.state(), guest, w).await
}

/// The events of `state`'s transitions and of `guest`'s changes, until the domain ends or
/// `state`'s sender goes.
async fn watch_events<G>(
    mut rx: tokio::sync::watch::Receiver<crate::actor::Observed>,
    mut guest: tokio::sync::watch::Receiver<G>,
    w: &mut (impl AsyncWriteExt + Unpin),
) -> std::io::Result<()> {
    let mut last = DomainState::Pending;
    // Only changes from here on: the subscriber reads the status on the first event
    // (`started` for a running guest), which carries the agent's state as it is.
    let mut last_agent = rx.borrow().agent_connected;
    // Set when `guest.changed()` woke the loop: that call marks the change seen, so
    // `has_changed()` alone would miss every change that arrives while the loop waits
    // (an address added in the guest never reached the VMI's status).
    let mut guest_changed = false;
    loop {
        if std::mem::take(&mut guest_changed) || guest.has_changed().unwrap_or(false) {
            guest.mark_unchanged();
            send(w, &Response::Event(DomainEvent::GuestInfo)).await?;
        }
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
        tokio::select! {
            r = rx.changed() => if r.is_err() {
                return Ok(());
            },
            // The poller's sender lives as long as the launcher; a closed one ends nothing.
            Ok(()) = guest.changed() => guest_changed = true,
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::actor::Observed;
    use tokio::sync::watch;

    fn events(bytes: &[u8]) -> Vec<DomainEvent> {
        bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| match serde_json::from_slice(l).unwrap() {
                Response::Event(e) => e,
                other => panic!("not an event: {other:?}"),
            })
            .collect()
    }

    /// Every change of what the agent reports is an event, however many arrive while the
    /// stream waits; the stream ends with the domain.
    #[tokio::test]
    async fn every_guest_change_is_an_event_until_the_domain_ends() {
        let (state, rx) = watch::channel(Observed {
            state: DomainState::Running,
            reason: None,
            agent_connected: true,
        });
        let (guest, mut guest_rx) = watch::channel(0u32);
        guest_rx.mark_unchanged();
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let task = tokio::spawn(async move { watch_events(rx, guest_rx, &mut server).await });
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        use tokio::io::AsyncReadExt;
        let mut read_events = async |n: usize, seen: &mut Vec<DomainEvent>| {
            while seen.len() < n {
                let k = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
                    .await
                    .expect("an event within 5 s")
                    .unwrap();
                seen.extend(events(&buf[..k]));
            }
        };
        read_events(1, &mut seen).await;
        assert_eq!(seen, [DomainEvent::Started]);
        for i in 1..=3u32 {
            guest.send_replace(i);
            read_events(1 + i as usize, &mut seen).await;
        }
        assert_eq!(
            &seen[1..],
            [
                DomainEvent::GuestInfo,
                DomainEvent::GuestInfo,
                DomainEvent::GuestInfo
            ]
        );
        state.send_modify(|o| o.state = DomainState::Shutoff);
        read_events(5, &mut seen).await;
        assert_eq!(seen[4], DomainEvent::ShutDown);
        task.await.unwrap().unwrap();
    }
}
