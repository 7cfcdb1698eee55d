//! Shutdown on SIGTERM (what kubelet sends) or SIGINT.
//!
//! A container's first process gets no default action for a signal it does not handle:
//! without a SIGTERM handler the process would keep running — and, for virt-controller,
//! keep leading with its old configuration — until kubelet's SIGKILL at the end of the
//! grace period.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Cancels `token` on the first SIGTERM or SIGINT. The handlers are installed before it
/// returns (it must run inside a tokio runtime); the wait runs in a spawned task.
pub fn cancel_on_termination(token: CancellationToken) {
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    tokio::spawn(async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = int.recv() => tracing::info!("SIGINT: shutting down"),
                    _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                }
            }
            (term, int) => {
                // Never happens on Linux; if it did, running on beats stopping at once.
                let e = term.err().or(int.err());
                tracing::error!(error = ?e, "no signal handler: SIGTERM will not shut down");
                std::future::pending::<()>().await;
            }
        }
        token.cancel();
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn sigterm_cancels_the_token() {
        let token = CancellationToken::new();
        cancel_on_termination(token.clone());
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "kill -TERM failed");
        assert!(
            tokio::time::timeout(Duration::from_secs(10), token.cancelled())
                .await
                .is_ok(),
            "SIGTERM did not cancel"
        );
    }
}
