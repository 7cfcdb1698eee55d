//! `kubectl virt migrate NAME --wait`: follows the migration the request created until it
//! ends, one progress line per change (phase, percent of memory transferred, rate), then
//! the outcome; a failed migration is an error (exit 1) naming the reason.

use std::io::Write;
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::ListParams;
use kubevirt_api::{
    VirtualMachineInstanceMigration, VirtualMachineInstanceMigrationPhase as Phase,
    VirtualMachineInstanceMigrationState as State,
};

use crate::connect::Session;
use crate::error::{CliError, Target, from_kube};
use crate::ops::VMI_NAME_LABEL;

const POLL: Duration = Duration::from_millis(500);
/// How long the new migration may take to appear in a list.
const APPEAR: Duration = Duration::from_secs(10);

const MIB: f64 = 1024.0 * 1024.0;

/// One progress line for `phase` and the migration's state; `rate` in bytes/s.
pub fn progress_line(phase: &str, state: Option<&State>, rate: Option<f64>) -> String {
    let Some(s) = state else {
        return format!("{phase:<16}");
    };
    let (total, done) = (
        s.data_total_bytes.unwrap_or(0).max(0) as f64,
        s.data_processed_bytes.unwrap_or(0).max(0) as f64,
    );
    if total <= 0.0 {
        return format!("{phase:<16}");
    }
    // Dirty pages are sent again: processed can exceed the total.
    let pct = (done / total * 100.0).min(100.0);
    let filled = (pct / 5.0).round() as usize;
    let bar: String = "#".repeat(filled) + &"-".repeat(20 - filled.min(20));
    let mut line = format!(
        "{phase:<16} [{bar}] {pct:3.0}%  {:.1} of {:.1} MiB",
        done / MIB,
        total / MIB
    );
    if let Some(r) = rate.filter(|r| *r > 0.0) {
        line.push_str(&format!(", {:.1} MiB/s", r / MIB));
    }
    if let Some(i) = s.iteration.filter(|i| *i > 0) {
        line.push_str(&format!(", iteration {i}"));
    }
    line
}

/// The last line: where the VM went, how long it took, the guest's pause.
pub fn outcome_line(vm: &str, state: Option<&State>, took: Duration) -> String {
    let node = state
        .and_then(|s| s.target_node.as_deref())
        .unwrap_or("the target node");
    let mut line = format!(
        "VM {vm} migrated to node {node} in {:.1} s",
        took.as_secs_f64()
    );
    if let Some(d) = state.and_then(|s| s.downtime_ms) {
        line.push_str(&format!(" (downtime {d} ms)"));
    }
    line
}

fn phase_name(p: &Phase) -> String {
    serde_json::to_value(p)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "Pending".into())
}

/// Follows the newest unfinished migration of `vm` (created `since` or later) to its end.
pub async fn wait(
    session: &Session,
    vm: &str,
    started: Instant,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let api: Api<VirtualMachineInstanceMigration> =
        Api::namespaced(session.client.clone(), &session.namespace);
    let target = Target {
        kind: "migration",
        group: kubevirt_api::GROUP,
        resource: "virtualmachineinstancemigrations",
        subresource: None,
        verb: "list",
        action: "list",
        name: vm.to_owned(),
        namespace: session.namespace.clone(),
    };
    let lp = ListParams::default().labels(&format!("{VMI_NAME_LABEL}={vm}"));
    let list = || async {
        api.list(&lp)
            .await
            .map_err(|e| from_kube(&target, &session.server, e))
    };
    // The migration the request created: the newest unfinished one.
    let name = loop {
        let items = list().await?.items;
        if let Some(m) = crate::ops::pick_active_migration(items, vm) {
            break m.metadata.name.unwrap_or_default();
        }
        if started.elapsed() > APPEAR {
            return Err(CliError::NoActiveMigration {
                name: vm.to_owned(),
                namespace: session.namespace.clone(),
            });
        }
        tokio::time::sleep(POLL).await;
    };
    let mut last_line = String::new();
    let mut last_sample: Option<(Instant, i64)> = None;
    let mut rate = None;
    loop {
        let m = match api.get_opt(&name).await {
            Ok(Some(m)) => m,
            // Deleted (migrate-cancel) and its finalizer released.
            Ok(None) => {
                return Err(CliError::MigrationFailed {
                    name: vm.to_owned(),
                    namespace: session.namespace.clone(),
                    reason: format!("migration {name} was deleted (cancelled)"),
                });
            }
            Err(e) => return Err(from_kube(&target, &session.server, e)),
        };
        let status = m.status.unwrap_or_default();
        let state = status.migration_state.as_ref();
        if let Some(done) = state.and_then(|s| s.data_processed_bytes) {
            let now = Instant::now();
            if let Some((t, d)) = last_sample
                && done > d
            {
                rate = Some((done - d) as f64 / now.duration_since(t).as_secs_f64());
            }
            if last_sample.is_none_or(|(_, d)| done != d) {
                last_sample = Some((now, done));
            }
        }
        match status.phase {
            Phase::Succeeded => {
                let line = outcome_line(vm, state, started.elapsed());
                return writeln!(out, "{line}").map_err(|e| CliError::io("writing output", e));
            }
            Phase::Failed => {
                let reason = state
                    .and_then(|s| s.failure_reason.clone())
                    .unwrap_or_else(|| "no reason given".into());
                return Err(CliError::MigrationFailed {
                    name: vm.to_owned(),
                    namespace: session.namespace.clone(),
                    reason,
                });
            }
            ref p => {
                let line = progress_line(&phase_name(p), state, rate);
                if line != last_line {
                    writeln!(out, "{line}").map_err(|e| CliError::io("writing output", e))?;
                    let _ = out.flush();
                    last_line = line;
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn state(v: serde_json::Value) -> State {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn progress_shows_percent_rate_and_iteration() {
        let s = state(serde_json::json!({
            "dataTotalBytes": 134217728i64, "dataProcessedBytes": 67108864i64, "iteration": 2
        }));
        assert_eq!(
            progress_line("Running", Some(&s), Some(8.0 * MIB)),
            "Running          [##########----------]  50%  64.0 of 128.0 MiB, 8.0 MiB/s, iteration 2"
        );
        assert_eq!(progress_line("Scheduling", None, None).trim(), "Scheduling");
        // Pages sent twice do not make it more than done.
        let over = state(serde_json::json!({"dataTotalBytes": 10, "dataProcessedBytes": 15}));
        assert!(progress_line("Running", Some(&over), None).contains("100%"));
    }

    #[test]
    fn outcome_names_the_node_and_the_downtime() {
        let s = state(serde_json::json!({"targetNode": "node-2", "downtimeMs": 120}));
        assert_eq!(
            outcome_line("vm1", Some(&s), Duration::from_millis(4200)),
            "VM vm1 migrated to node node-2 in 4.2 s (downtime 120 ms)"
        );
    }
}
