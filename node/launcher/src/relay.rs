//! A unix-socket relay: the migration target's `libvirt.sock` in the shared migration
//! directory forwards to the private libvirtd's socket in the work directory, which
//! virt-handler cannot see (it is in the pod's emptyDir).

use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

/// Binds `path` (a stale socket file is replaced).
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path)
}

/// Accepts on `listener` until `stop`, relaying each connection to the socket `to`;
/// removes `path` at the end.
pub async fn serve(listener: UnixListener, path: PathBuf, to: PathBuf, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => {
                let Ok((mut a, _)) = accepted else { break };
                let to = to.clone();
                tokio::spawn(async move {
                    match UnixStream::connect(&to).await {
                        Ok(mut b) => {
                            let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                        }
                        Err(e) => tracing::warn!(to = %to.display(), error = %e, "relay connect failed"),
                    }
                });
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}
