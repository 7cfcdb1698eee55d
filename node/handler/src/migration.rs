//! What the handlers write into a VMI's `status.migrationState` (cluster-flow.md §6.3),
//! pure: from the launcher's [`MigrationStatus`] and the state as last read to a JSON
//! merge patch of only the fields the handler owns. A merge patch merges nested objects,
//! so the controller's fields (uids, nodes, pods, `abortRequested`) are never touched.

use kubevirt_api::VirtualMachineInstanceMigrationState as State;
use serde_json::{Map, Value, json};
use virt_domain::protocol::{MigrationProgress, MigrationStatus};

/// Reason written for a migration aborted on request (KubeVirt's wording).
pub const ABORTED_REASON: &str = "Live migration aborted";

/// The host socket directory of a migration target's launcher: the VMI's, suffixed with
/// the first 8 hex digits of the migration uid (virt-controller's `target_socket_dir`,
/// cluster-flow.md §6.2).
pub fn target_socket_dir(vmi_dir: &str, migration_uid: &str) -> String {
    let short: String = migration_uid
        .chars()
        .filter(|c| *c != '-')
        .take(8)
        .collect();
    format!("{vmi_dir}-{short}")
}

fn figures(m: &mut Map<String, Value>, p: &MigrationProgress) {
    let n = |v: u64| json!(i64::try_from(v).unwrap_or(i64::MAX));
    m.insert("dataTotalBytes".into(), n(p.data_total));
    m.insert("dataProcessedBytes".into(), n(p.data_processed));
    m.insert("dataRemainingBytes".into(), n(p.data_remaining));
    m.insert("iteration".into(), n(p.memory_iteration));
    if let Some(d) = p.downtime_ms {
        m.insert("downtimeMs".into(), n(d));
    }
}

/// The source handler's fields for `status` (the launcher's migration status) given the
/// VMI's current `prev` state; `now` is an RFC 3339 time. `None` when nothing changes.
/// `abortStatus` is written when the controller asked for the abort (`abortRequested`).
pub fn source_patch(prev: &State, status: &MigrationStatus, now: &str) -> Option<Value> {
    let mut m = Map::new();
    if prev.start_timestamp.is_none() && !matches!(status, MigrationStatus::Idle) {
        m.insert("startTimestamp".into(), json!(now));
        m.insert("mode".into(), json!("PreCopy"));
    }
    let ends = |m: &mut Map<String, Value>| {
        if prev.end_timestamp.is_none() {
            m.insert("endTimestamp".into(), json!(now));
        }
    };
    match status {
        MigrationStatus::Idle => {}
        MigrationStatus::Running { progress } => {
            figures(&mut m, progress);
            if prev.abort_requested == Some(true) && prev.abort_status.is_none() {
                m.insert("abortStatus".into(), json!("Aborting"));
            }
        }
        MigrationStatus::Completed { progress } => {
            figures(&mut m, progress);
            m.insert("completed".into(), json!(true));
            ends(&mut m);
            if prev.abort_requested == Some(true) {
                // The abort lost the race: the guest is on the target.
                m.insert("abortStatus".into(), json!("Failed"));
            }
        }
        MigrationStatus::Failed { reason } => {
            m.insert("failed".into(), json!(true));
            m.insert("failureReason".into(), json!(reason));
            ends(&mut m);
            if prev.abort_requested == Some(true) {
                m.insert("abortStatus".into(), json!("Succeeded"));
            }
        }
        MigrationStatus::Cancelled => {
            m.insert("failed".into(), json!(true));
            m.insert("failureReason".into(), json!(ABORTED_REASON));
            m.insert("abortStatus".into(), json!("Succeeded"));
            ends(&mut m);
        }
    }
    // Only what differs from the state as read.
    let current = serde_json::to_value(prev).unwrap_or(Value::Null);
    m.retain(|k, v| current.get(k) != Some(v));
    (!m.is_empty()).then(|| json!({"status": {"migrationState": Value::Object(m)}}))
}

/// The target handler's signal that the target is prepared and its endpoint listens.
pub fn target_ready_patch(address: &str) -> Value {
    json!({"status": {"migrationState": {"targetNodeAddress": address}}})
}

/// The target handler saw the migrated domain run: from now on it owns the VMI's status.
pub fn target_detected_patch(now: &str) -> Value {
    json!({"status": {"migrationState": {
        "targetNodeDomainDetected": true,
        "targetNodeDomainReadyTimestamp": now,
    }}})
}

/// Errors of a handler's part in a migration.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The launcher could not be reached.
    #[error(transparent)]
    Launcher(#[from] crate::client::ClientError),
    /// The launcher refused or answered something else.
    #[error("launcher: {0}")]
    Refused(String),
    /// The proxy could not start.
    #[error(transparent)]
    Proxy(#[from] crate::migration_proxy::ProxyError),
    /// The launcher's migration directory cannot be used.
    #[error("the launcher's migration directory: {0}")]
    Directory(#[from] crate::launcher_fs::LauncherFsError),
}

/// The launcher's migration directory (`migration/` beside its sockets), made if missing.
pub async fn migration_dir(
    launcher: &crate::client::LauncherClient,
) -> Result<std::sync::Arc<crate::launcher_fs::SocketsDir>, MigrationError> {
    let dir = launcher.dir().get().await?;
    let sub =
        tokio::task::spawn_blocking(move || dir.make_subdir(virt_domain::protocol::MIGRATION_DIR))
            .await
            .map_err(|e| {
                MigrationError::Refused(format!("opening the migration directory: {e}"))
            })??;
    Ok(std::sync::Arc::new(sub))
}

fn refused(r: virt_domain::protocol::Response) -> MigrationError {
    match r {
        virt_domain::protocol::Response::Error { message } => MigrationError::Refused(message),
        other => MigrationError::Refused(format!("unexpected reply {other:?}")),
    }
}

/// Target handler: asks the target launcher to get ready and opens the endpoint the
/// source connects to (its address is `targetNodeAddress`).
pub async fn prepare_target(
    launcher: &crate::client::LauncherClient,
    listen: std::net::SocketAddr,
    tls: std::sync::Arc<rustls::ServerConfig>,
    source_node: &str,
) -> Result<
    (
        crate::migration_proxy::TargetProxy,
        virt_domain::protocol::MigrationTarget,
    ),
    MigrationError,
> {
    use virt_domain::protocol::{Request, Response};
    let target = match launcher.call(&Request::PrepareMigrationTarget).await? {
        Response::MigrationTargetReady(t) => t,
        other => return Err(refused(other)),
    };
    let proxy = crate::migration_proxy::TargetProxy::start(
        listen,
        tls,
        migration_dir(launcher).await?,
        virt_certs::node_identity::common_name(source_node),
    )
    .await?;
    Ok((proxy, target))
}

/// Source handler: opens the tunnel to `target_addr`, starts the launcher's migration
/// and reports every status to `report` until the final one, which it returns. The
/// proxy is closed at the end (a cancel that libvirt did not honour ends here too).
pub async fn run_source(
    launcher: &crate::client::LauncherClient,
    target_addr: std::net::SocketAddr,
    tls: std::sync::Arc<rustls::ClientConfig>,
    target_node: &str,
    request: virt_domain::protocol::MigrateRequest,
    mut report: impl FnMut(&MigrationStatus),
) -> Result<MigrationStatus, MigrationError> {
    use virt_domain::protocol::{Request, Response};
    let name = rustls_pki_types::ServerName::try_from(target_node.to_string())
        .map_err(|e| MigrationError::Refused(format!("target node name {target_node:?}: {e}")))?;
    let proxy = crate::migration_proxy::SourceProxy::start(
        migration_dir(launcher).await?,
        target_addr,
        tls,
        name,
    )?;
    match launcher.call(&Request::Migrate(request)).await? {
        Response::Ok => {}
        other => return Err(refused(other)),
    }
    let mut events = launcher.watch_migration().await?;
    let last = loop {
        match events.next().await? {
            Some(st) => {
                report(&st);
                if st.is_final() {
                    break st;
                }
            }
            None => {
                break MigrationStatus::Failed {
                    reason: "the launcher closed the migration stream".into(),
                };
            }
        }
    };
    proxy.close();
    Ok(last)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const NOW: &str = "2026-11-30T07:40:00Z";

    fn progress(done: u64) -> MigrationProgress {
        MigrationProgress {
            data_total: 100,
            data_processed: done,
            data_remaining: 100 - done,
            memory_iteration: 1,
            ..Default::default()
        }
    }

    #[test]
    fn a_running_migration_starts_once_and_reports_figures() {
        let prev = State::default();
        let p = source_patch(
            &prev,
            &MigrationStatus::Running {
                progress: progress(40),
            },
            NOW,
        )
        .unwrap();
        let m = &p["status"]["migrationState"];
        assert_eq!(m["startTimestamp"], NOW);
        assert_eq!(m["mode"], "PreCopy");
        assert_eq!(m["dataProcessedBytes"], 40);
        assert_eq!(m["dataRemainingBytes"], 60);
        // Started already, same figures: nothing to write.
        let prev: State = serde_json::from_value(m.clone()).unwrap();
        let again = MigrationStatus::Running {
            progress: progress(40),
        };
        assert_eq!(source_patch(&prev, &again, "later"), None);
        // New figures only.
        let p = source_patch(
            &prev,
            &MigrationStatus::Running {
                progress: progress(70),
            },
            "later",
        )
        .unwrap();
        let keys: Vec<_> = p["status"]["migrationState"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(keys, ["dataProcessedBytes", "dataRemainingBytes"]);
    }

    #[test]
    fn outcomes_and_aborts() {
        let started = State {
            start_timestamp: serde_json::from_value(json!(NOW)).unwrap(),
            ..State::default()
        };
        let done = source_patch(
            &started,
            &MigrationStatus::Completed {
                progress: MigrationProgress {
                    downtime_ms: Some(120),
                    ..progress(100)
                },
            },
            NOW,
        )
        .unwrap();
        let m = &done["status"]["migrationState"];
        assert_eq!(m["completed"], true);
        assert_eq!(m["downtimeMs"], 120);
        assert_eq!(m["endTimestamp"], NOW);
        assert!(m.get("abortStatus").is_none());

        let failed = source_patch(
            &started,
            &MigrationStatus::Failed {
                reason: "internal error: client socket is closed".into(),
            },
            NOW,
        )
        .unwrap();
        let m = &failed["status"]["migrationState"];
        assert_eq!(m["failed"], true);
        assert_eq!(
            m["failureReason"],
            "internal error: client socket is closed"
        );

        let asked = State {
            abort_requested: Some(true),
            ..started.clone()
        };
        let aborting = source_patch(
            &asked,
            &MigrationStatus::Running {
                progress: progress(10),
            },
            NOW,
        )
        .unwrap();
        assert_eq!(
            aborting["status"]["migrationState"]["abortStatus"],
            "Aborting"
        );
        let cancelled = source_patch(&asked, &MigrationStatus::Cancelled, NOW).unwrap();
        let m = &cancelled["status"]["migrationState"];
        assert_eq!(m["abortStatus"], "Succeeded");
        assert_eq!(m["failureReason"], ABORTED_REASON);
        let lost_race = source_patch(
            &asked,
            &MigrationStatus::Completed {
                progress: progress(100),
            },
            NOW,
        )
        .unwrap();
        assert_eq!(
            lost_race["status"]["migrationState"]["abortStatus"],
            "Failed"
        );
    }

    #[test]
    fn target_directory_matches_the_controllers() {
        assert_eq!(
            target_socket_dir(
                "/var/run/kubevirt-rs/sockets/0b7a",
                "1234abcd-ef56-7890-abcd-ef1234567890"
            ),
            "/var/run/kubevirt-rs/sockets/0b7a-1234abcd"
        );
    }
}
