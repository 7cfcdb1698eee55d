//! The backup document of `GET /apis/subresources.kubevirt.io/v1/backup`, which
//! `PUT …/restore` takes back (`kubectl virt adm backup` / `restore`, docs/deploy.md
//! "Backup and restore").
//!
//! Objects are named by resource, namespace and name, never by etcd key: a backup restores
//! into a server with another etcd prefix, and a document cannot write a key outside the
//! kinds virt-apiserver stores.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `kind` of a backup document.
pub const KIND: &str = "Backup";
/// `kind` of a restore's answer.
pub const RESULT_KIND: &str = "RestoreResult";

/// Every object virt-apiserver stores, read at one etcd revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    pub api_version: String,
    pub kind: String,
    pub metadata: BackupMeta,
    /// In resource, namespace, name order.
    pub items: Vec<BackupItem>,
}

/// When and at which revision a backup was read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupMeta {
    /// RFC 3339.
    pub creation_timestamp: String,
    /// The etcd revision every item was read at.
    pub resource_version: String,
}

/// One stored object, as stored (without `metadata.resourceVersion`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupItem {
    /// Plural resource name of `kubevirt.io/v1` (`virtualmachines`, …).
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub object: serde_json::Value,
    /// Inline cloud-init data (user data and network data, which often hold passwords and
    /// keys) was left out: the user who took the backup may not read Secrets in the item's
    /// namespace. Such an item cannot be restored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redacted: bool,
}

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreResult {
    pub api_version: String,
    pub kind: String,
    /// Objects of the backup that no longer existed, created again (same uid, no status:
    /// the components observe it anew).
    pub created: u64,
    /// Objects whose stored state differed, set back to the backup's.
    pub updated: u64,
    /// Objects created after the backup, deleted.
    pub deleted: u64,
    /// Objects already as in the backup, not written.
    pub unchanged: u64,
    /// Objects of the backup not created again, each with why (their namespace is gone or
    /// being deleted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// The etcd revision after the last write.
    pub resource_version: String,
}

/// The kinds OpenAPI publishes for the backup endpoints.
pub const KINDS: [&str; 2] = [KIND, RESULT_KIND];

/// The schema of `kind` (one of [`KINDS`]) as `settings` generate it.
pub fn root_schema(
    kind: &str,
    settings: schemars::generate::SchemaSettings,
) -> Option<schemars::Schema> {
    let g = settings.into_generator();
    Some(match kind {
        KIND => g.into_root_schema_for::<Backup>(),
        RESULT_KIND => g.into_root_schema_for::<RestoreResult>(),
        _ => return None,
    })
}
