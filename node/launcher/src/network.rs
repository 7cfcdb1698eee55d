//! The launcher's half of pod networking: wait for virt-handler to build the guest's
//! devices in this pod (`virt_netsetup::handoff`), then answer the guest's DHCP with the
//! socket it passed. The launcher itself holds no network privilege.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use virt_domain::PodTap;
use virt_netsetup::{NetworkPlan, exec, handoff, plan::TAP};

/// How long to wait for virt-handler. Generous: a handler restarting (image pull, node
/// under load) should delay a VM, not fail it.
pub const WAIT: Duration = Duration::from_secs(300);

/// Why the pod network is not there.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// No socket directory to meet virt-handler in.
    #[error("the pod network needs virt-handler: no --cmd-socket given")]
    NoSocketDir,
    /// The socket could not be served.
    #[error("{path}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// virt-handler did not come.
    #[error("virt-handler did not set up the pod network within {0:?}")]
    Timeout(Duration),
    /// The waiting task died.
    #[error("waiting for the pod network: {0}")]
    Task(String),
    /// Stopped while waiting.
    #[error("stopped while waiting for the pod network")]
    Cancelled,
    /// The hand-off failed or virt-handler reported a failure.
    #[error(transparent)]
    Handoff(#[from] handoff::HandoffError),
}

/// Listens on `net.sock` beside the command socket until virt-handler hands the network
/// over; starts the DHCP server and returns the tap for the domain.
pub async fn receive(
    cmd_socket: Option<&Path>,
    wait: Duration,
    shutdown: &CancellationToken,
) -> Result<(NetworkPlan, PodTap), NetworkError> {
    let dir = cmd_socket
        .and_then(Path::parent)
        .ok_or(NetworkError::NoSocketDir)?;
    let path = dir.join(handoff::SOCKET);
    let io = |source| NetworkError::Io {
        path: path.clone(),
        source,
    };
    let _ = std::fs::remove_file(&path);
    std::fs::create_dir_all(dir).map_err(io)?;
    let listener = tokio::net::UnixListener::bind(&path).map_err(io)?;
    tracing::info!(socket = %path.display(), "waiting for virt-handler to set up the pod network");
    let accepted = tokio::select! {
        r = listener.accept() => r.map_err(io),
        _ = tokio::time::sleep(wait) => Err(NetworkError::Timeout(wait)),
        _ = shutdown.cancelled() => Err(NetworkError::Cancelled),
    };
    // Gone before anything else: virt-handler serves each socket it finds once.
    let _ = std::fs::remove_file(&path);
    drop(listener);
    let (stream, _) = accepted?;
    let stream = stream.into_std().map_err(io)?;
    stream.set_nonblocking(false).map_err(io)?;
    stream.set_read_timeout(Some(wait)).map_err(io)?;
    let (plan, dhcp) = tokio::task::spawn_blocking(move || handoff::receive(&stream))
        .await
        .map_err(|e| io(std::io::Error::other(e)))??;
    let lease = plan.lease.clone();
    // The guest may ask again at any time (reboot, renewal); the server lives as long as
    // the launcher.
    std::thread::Builder::new()
        .name("dhcp".into())
        .spawn(move || {
            if let Err(e) = exec::serve_dhcp(&dhcp, &lease) {
                tracing::error!(error = %e, "DHCP server stopped");
            }
        })
        .map_err(io)?;
    tracing::info!(guest = %plan.lease.address, mac = %plan.lease.mac, "pod network ready");
    let tap = PodTap {
        interface: plan.interface.clone(),
        device: TAP.into(),
        mac: plan.lease.mac.to_string(),
        mtu: plan.pod.mtu,
    };
    Ok((plan, tap))
}
