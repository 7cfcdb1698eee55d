//! `adm backup` and `adm restore` (virt-apiserver's backup endpoints, docs/deploy.md
//! "Backup and restore").

use std::io::Write;

use http::Request;
use http::header::CONTENT_TYPE;

use crate::connect::Session;
use crate::error::{CliError, Target, from_kube};
use crate::request::SUBRESOURCES_GROUP;

fn admin_target(endpoint: &kubevirt_api::catalogue::AdminEndpoint, action: &'static str) -> Target {
    Target {
        kind: "backup",
        group: SUBRESOURCES_GROUP,
        resource: endpoint.name,
        subresource: None,
        verb: endpoint.rbac_verb,
        action,
        name: String::new(),
        namespace: String::new(),
    }
}

/// `adm backup --to FILE`: the document goes to `FILE.partial` first and is renamed into
/// place once complete, so FILE is never a truncated backup.
pub async fn backup(
    session: &Session,
    to: &std::path::Path,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    use kubevirt_api::catalogue::BACKUP;
    let path = BACKUP.path();
    let req = Request::get(&path)
        .body(Vec::new())
        .map_err(|e| CliError::Protocol(format!("building request for {path}: {e}")))?;
    let backup: kubevirt_api::backup::Backup = session
        .client
        .request(req)
        .await
        .map_err(|e| from_kube(&admin_target(&BACKUP, "back up"), &session.server, e))?;
    let bytes = serde_json::to_vec_pretty(&backup)
        .map_err(|e| CliError::Protocol(format!("encoding the backup: {e}")))?;
    let mut partial = to.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let write = |what: &str, e| CliError::io(format!("{what} {}", to.display()), e);
    // Only its owner may read it: it holds every VM's inline cloud-init data that the taker
    // could read (N14 of the security review at bd37f96).
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)
            .map_err(|e| write("writing", e))?;
        // A file left by an earlier run keeps its mode: set it.
        std::fs::set_permissions(
            &partial,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .map_err(|e| write("writing", e))?;
        f.write_all(&bytes).map_err(|e| write("writing", e))?;
    }
    std::fs::rename(&partial, to).map_err(|e| write("moving the finished backup to", e))?;
    let redacted = backup.items.iter().filter(|i| i.redacted).count();
    if redacted > 0 {
        writeln!(
            out,
            "Warning: {redacted} objects were backed up without their inline cloud-init data \
             (you may not read Secrets in their namespaces); they cannot be restored from this file"
        )
        .map_err(|e| CliError::io("writing output", e))?;
    }
    writeln!(
        out,
        "Backed up {} objects (resourceVersion {}) to {}",
        backup.items.len(),
        backup.metadata.resource_version,
        to.display()
    )
    .map_err(|e| CliError::io("writing output", e))
}

/// `adm restore --from FILE`.
pub async fn restore(
    session: &Session,
    from: &std::path::Path,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    use kubevirt_api::catalogue::RESTORE;
    let bytes =
        std::fs::read(from).map_err(|e| CliError::io(format!("reading {}", from.display()), e))?;
    let doc: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        CliError::Usage(format!(
            "{} is not a backup written by `kubectl virt adm backup`: {e}",
            from.display()
        ))
    })?;
    if doc["kind"] != kubevirt_api::backup::KIND {
        return Err(CliError::Usage(format!(
            "{} is not a backup written by `kubectl virt adm backup`: its kind is {}, not {}",
            from.display(),
            doc["kind"],
            kubevirt_api::backup::KIND
        )));
    }
    let path = RESTORE.path();
    let req = Request::put(&path)
        .header(CONTENT_TYPE, "application/json")
        .body(bytes)
        .map_err(|e| CliError::Protocol(format!("building request for {path}: {e}")))?;
    let r: kubevirt_api::backup::RestoreResult = session
        .client
        .request(req)
        .await
        .map_err(|e| from_kube(&admin_target(&RESTORE, "restore"), &session.server, e))?;
    writeln!(
        out,
        "Restored {} (resourceVersion {} of {}): {} created, {} updated, {} deleted, {} unchanged",
        from.display(),
        doc["metadata"]["resourceVersion"].as_str().unwrap_or("?"),
        doc["metadata"]["creationTimestamp"].as_str().unwrap_or("?"),
        r.created,
        r.updated,
        r.deleted,
        r.unchanged
    )
    .map_err(|e| CliError::io("writing output", e))?;
    for s in &r.skipped {
        writeln!(out, "  not restored: {s}").map_err(|e| CliError::io("writing output", e))?;
    }
    Ok(())
}
