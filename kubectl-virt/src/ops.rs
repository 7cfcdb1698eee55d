//! Commands that talk to the API server with plain requests.

use std::io::Write;

use http::Request;
use http::header::CONTENT_TYPE;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use kubevirt_api::{VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration};

use crate::connect::Session;
use crate::error::{CliError, Target, from_kube};
use crate::request::{
    Action, SUBRESOURCES_GROUP, SUBRESOURCES_VERSION, SubresourceRequest, validate_name,
};

/// Label KubeVirt puts on migrations, and virtctl's migrate-cancel selects by.
pub use kubevirt_api::migration::names::VMI_NAME_LABEL;

/// Whether a `pause`/`unpause` names a VM or a VMI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ObjectKind {
    #[value(name = "vm", alias = "vms", alias = "virtualmachine")]
    Vm,
    #[value(name = "vmi", alias = "vmis", alias = "virtualmachineinstance")]
    Vmi,
}

/// What `evacuate-cancel` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EvacuateKind {
    #[value(name = "vm", alias = "vms", alias = "virtualmachine")]
    Vm,
    #[value(name = "vmi", alias = "vmis", alias = "virtualmachineinstance")]
    Vmi,
    #[value(name = "node", alias = "nodes", alias = "no")]
    Node,
}

/// `evacuate-cancel node NAME`: cancels the evacuation of every VMI (all namespaces) being
/// evacuated from that node.
pub async fn evacuate_cancel_node(
    session: &Session,
    node: &str,
    dry_run: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let target = Target {
        kind: "VMI",
        group: kubevirt_api::GROUP,
        resource: "virtualmachineinstances",
        subresource: None,
        verb: "list",
        action: "list",
        name: String::new(),
        namespace: String::new(),
    };
    let api: Api<VirtualMachineInstance> = Api::all(session.client.clone());
    let vmis = api
        .list(&ListParams::default())
        .await
        .map_err(|e| from_kube(&target, &session.server, e))?;
    let leaving: Vec<(String, String)> = vmis
        .items
        .iter()
        .filter(|v| {
            v.status
                .as_ref()
                .and_then(|s| s.evacuation_node_name.as_deref())
                == Some(node)
        })
        .map(|v| {
            (
                v.metadata.namespace.clone().unwrap_or_default(),
                v.metadata.name.clone().unwrap_or_default(),
            )
        })
        .collect();
    if leaving.is_empty() {
        return writeln!(out, "No VMI is being evacuated from node {node}")
            .map_err(|e| CliError::io("writing output", e));
    }
    let action = crate::request::evacuate_cancel(true, dry_run);
    for (ns, name) in leaving {
        let req = action.request(&ns, &name)?;
        put(session, &req).await?;
        let dry = if dry_run { " (server dry run)" } else { "" };
        writeln!(
            out,
            "VMI {ns}/{name} was scheduled to cancel its evacuation{dry}"
        )
        .map_err(|e| CliError::io("writing output", e))?;
    }
    Ok(())
}

/// `PUT`s a subresource request, errors naming its target.
pub async fn put_request(session: &Session, r: &SubresourceRequest) -> Result<(), CliError> {
    put(session, r).await
}

async fn put(session: &Session, r: &SubresourceRequest) -> Result<(), CliError> {
    let body = serde_json::to_vec(&r.body)
        .map_err(|e| CliError::Protocol(format!("encoding request body: {e}")))?;
    let req = Request::put(&r.path)
        .header(CONTENT_TYPE, "application/json")
        .body(body)
        .map_err(|e| CliError::Protocol(format!("building request for {}: {e}", r.path)))?;
    session
        .client
        .request_text(req)
        .await
        .map(drop)
        .map_err(|e| from_kube(&r.target, &session.server, e))
}

fn vm_get_target(session: &Session, name: &str) -> Target {
    Target {
        kind: "VM",
        group: kubevirt_api::GROUP,
        resource: "virtualmachines",
        subresource: None,
        verb: "get",
        action: "get",
        name: name.to_owned(),
        namespace: session.namespace.clone(),
    }
}

/// Fetches a VM, with errors naming it and its namespace.
pub async fn get_vm(session: &Session, name: &str) -> Result<VirtualMachine, CliError> {
    let api: Api<VirtualMachine> = Api::namespaced(session.client.clone(), &session.namespace);
    api.get(name)
        .await
        .map_err(|e| from_kube(&vm_get_target(session, name), &session.server, e))
}

/// Runs a lifecycle action and prints virtctl's confirmation line.
pub async fn run_action(
    session: &Session,
    action: &Action,
    kind: ObjectKind,
    name: &str,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    validate_name("name", name)?;
    let req = action.request(&session.namespace, name)?;
    let on_vmi = req.target.resource == "virtualmachineinstances";
    if on_vmi && kind == ObjectKind::Vm {
        // `pause vm X` acts on the VM's instance, which has the VM's name;
        // checking the VM first tells "no such VM" from "VM not running".
        get_vm(session, name).await?;
        match put(session, &req).await {
            Err(CliError::NotFound { .. }) => {
                return Err(CliError::NotRunning {
                    kind: "VM",
                    name: name.to_owned(),
                    namespace: session.namespace.clone(),
                    message: String::new(),
                });
            }
            other => other?,
        }
    } else {
        put(session, &req).await?;
    }
    let label = match kind {
        ObjectKind::Vm => "VM",
        ObjectKind::Vmi => "VMI",
    };
    let dry = if action.is_dry_run() {
        " (server dry run)"
    } else {
        ""
    };
    writeln!(
        out,
        "{label} {name} was scheduled to {}{dry}",
        req.target.action
    )
    .map_err(|e| CliError::io("writing output", e))
}

/// Deletes the migration of `name` that has not finished yet, as virtctl's
/// migrate-cancel does (there is no cancel subresource).
pub async fn migrate_cancel(
    session: &Session,
    name: &str,
    dry_run: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    validate_name("name", name)?;
    let target = |verb: &'static str| Target {
        kind: "migration",
        group: kubevirt_api::GROUP,
        resource: "virtualmachineinstancemigrations",
        subresource: None,
        verb,
        action: if verb == "delete" { "delete" } else { "list" },
        name: name.to_owned(),
        namespace: session.namespace.clone(),
    };
    let api: Api<VirtualMachineInstanceMigration> =
        Api::namespaced(session.client.clone(), &session.namespace);
    let labelled = api
        .list(&ListParams::default().labels(&format!("{VMI_NAME_LABEL}={name}")))
        .await
        .map_err(|e| from_kube(&target("list"), &session.server, e))?;
    // Migrations created directly (not through the migrate subresource)
    // may lack the label; spec.vmiName is authoritative.
    let candidates = if labelled.items.is_empty() {
        api.list(&ListParams::default())
            .await
            .map_err(|e| from_kube(&target("list"), &session.server, e))?
            .items
    } else {
        labelled.items
    };
    let active =
        pick_active_migration(candidates, name).ok_or_else(|| CliError::NoActiveMigration {
            name: name.to_owned(),
            namespace: session.namespace.clone(),
        })?;
    let mig_name = active.metadata.name.clone().unwrap_or_default();
    let dp = DeleteParams {
        dry_run,
        ..DeleteParams::default()
    };
    api.delete(&mig_name, &dp).await.map_err(|e| {
        let mut t = target("delete");
        t.name = mig_name.clone();
        from_kube(&t, &session.server, e)
    })?;
    let dry = if dry_run { " (server dry run)" } else { "" };
    writeln!(
        out,
        "VM {name} was scheduled to migrate-cancel (deleted migration {mig_name}){dry}"
    )
    .map_err(|e| CliError::io("writing output", e))
}

/// The unfinished migration of VMI `vmi`, newest first if several.
pub fn pick_active_migration(
    migrations: Vec<VirtualMachineInstanceMigration>,
    vmi: &str,
) -> Option<VirtualMachineInstanceMigration> {
    let mut active: Vec<_> = migrations
        .into_iter()
        .filter(|m| m.spec.vmi_name == vmi)
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .filter(|m| !m.status.as_ref().is_some_and(|s| s.phase.is_final()))
        .collect();
    active.sort_by(|a, b| {
        b.metadata
            .creation_timestamp
            .cmp(&a.metadata.creation_timestamp)
    });
    active.into_iter().next()
}

/// Client and (when reachable) server version lines.
pub async fn version(
    session: Option<&Session>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    let w = |e| CliError::io("writing output", e);
    writeln!(
        out,
        "Client Version: {}",
        serde_json::json!({
            "gitVersion": concat!("v", env!("CARGO_PKG_VERSION")),
            "compiler": "rustc",
            "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        })
    )
    .map_err(w)?;
    let Some(session) = session else {
        return Ok(());
    };
    let path = format!("/apis/{SUBRESOURCES_GROUP}/{SUBRESOURCES_VERSION}/version");
    let req = Request::get(&path)
        .body(Vec::new())
        .map_err(|e| CliError::Protocol(format!("building request for {path}: {e}")))?;
    match session.client.request::<serde_json::Value>(req).await {
        Ok(v) => writeln!(out, "Server Version: {v}").map_err(w),
        Err(e) => {
            let target = Target {
                kind: "version",
                group: SUBRESOURCES_GROUP,
                resource: "version",
                subresource: None,
                verb: "get",
                action: "get",
                name: "version".into(),
                namespace: session.namespace.clone(),
            };
            // A missing server version must not fail `version`: the
            // client version is still useful for a bug report.
            writeln!(
                err,
                "Server Version: unavailable: {}",
                from_kube(&target, &session.server, e)
            )
            .map_err(w)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kubevirt_api::{
        VirtualMachineInstanceMigrationPhase as Phase, VirtualMachineInstanceMigrationSpec,
        VirtualMachineInstanceMigrationStatus,
    };

    fn mig(name: &str, vmi: &str, phase: Phase, created: i64) -> VirtualMachineInstanceMigration {
        let mut m = VirtualMachineInstanceMigration::new(
            name,
            VirtualMachineInstanceMigrationSpec {
                vmi_name: vmi.into(),
                added_node_selector: None,
            },
        );
        m.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
        ));
        m.status = Some(VirtualMachineInstanceMigrationStatus {
            phase,
            ..Default::default()
        });
        m
    }

    #[test]
    fn active_migration_is_unfinished_and_newest() {
        let all = vec![
            mig("old-done", "vm1", Phase::Succeeded, 1),
            mig("other-vm", "vm2", Phase::Running, 5),
            mig("running", "vm1", Phase::Running, 3),
            mig("pending", "vm1", Phase::Pending, 4),
            mig("failed", "vm1", Phase::Failed, 6),
        ];
        let m = pick_active_migration(all.clone(), "vm1").unwrap();
        assert_eq!(m.metadata.name.as_deref(), Some("pending"));
        assert!(pick_active_migration(all, "vm3").is_none());
        let done = vec![mig("a", "vm1", Phase::Succeeded, 1)];
        assert!(pick_active_migration(done, "vm1").is_none());
    }
}
