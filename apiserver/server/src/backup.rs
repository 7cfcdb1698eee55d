//! `GET /apis/subresources.kubevirt.io/v1/backup` and `PUT …/restore`: every stored object
//! read at one etcd revision, and set back to such a document (docs/deploy.md "Backup and
//! restore").
//!
//! A restore is logical, not an etcd snapshot restore: it writes the difference through
//! compare-and-swap, so revisions keep growing and every watcher (virt-controller,
//! virt-handler, kubectl) sees the restore as ordinary changes instead of time going
//! backwards, and nothing needs restarting. Uids come back with their objects, so launcher
//! pods (owned by VMI uid) are not garbage-collected. Status never comes from the document:
//! an object that exists now with the backup's uid keeps its current status, one created
//! again has none and the components observe it anew (the node and pods a VMI's status
//! names decide where virt-handler sends consoles: a document must not be able to name
//! another tenant's pod, N6 of the security review at bd37f96). A finished migration keeps
//! its final phase, or it would run again.
//!
//! Every object passes the same validation and input policy as any write (as a component:
//! restored objects carry the reserved labels components wrote), a uid another stored
//! object has is refused, and all of it is checked before the first write. A backup leaves
//! out inline cloud-init data of namespaces whose Secrets its taker may not read, and such
//! a backup cannot be restored.

use std::collections::BTreeMap;

use kubevirt_api::backup::{Backup, BackupItem, BackupMeta, KIND, RESULT_KIND, RestoreResult};
use kubevirt_api::validation::FieldError;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::kinds::ResourceDef;
use crate::rest::Registry;
use crate::storage::{Stored, decode_kv};

/// Keys read per etcd request while backing up.
const PAGE: i64 = 500;
/// Attempts per object when a component writes it between the restore's read and its write.
const ATTEMPTS: usize = 5;

fn api_version() -> String {
    format!("{}/v1", kubevirt_api::SUBRESOURCES_GROUP)
}

/// Every stored object of every kind at one revision (the current one), read in pages:
/// `(kind, stored object)` in kind, then key order, and the revision.
async fn read_all(registry: &Registry) -> ApiResult<(Vec<(&'static ResourceDef, Stored)>, i64)> {
    let store = registry.storage();
    let revision = store
        .current_revision()
        .await
        .map_err(crate::rest::storage_error)?;
    let mut out = Vec::new();
    for def in ResourceDef::stored() {
        let prefix = registry.collection_prefix(def, None);
        let mut start = String::new();
        loop {
            let page = store
                .list_raw(&prefix, &start, revision, PAGE)
                .await
                .map_err(crate::rest::storage_error)?;
            for kv in &page.kvs {
                out.push((def, decode_kv(kv).map_err(crate::rest::storage_error)?));
            }
            match page.kvs.last() {
                Some(last) if page.more => {
                    // The next key after the last one read.
                    let mut next = String::from_utf8_lossy(&last.key).into_owned();
                    next.push('\0');
                    start = next;
                }
                _ => break,
            }
        }
    }
    Ok((out, revision))
}

/// Reads every stored object at one revision. Inline cloud-init data of a namespace is
/// left out (the item marked `redacted`) unless `may_read_secrets(namespace)`: user data is
/// where passwords and keys go, and `list` on `backup` must not read more than the taker
/// could read as Secrets.
pub async fn backup<F, Fut>(registry: &Registry, may_read_secrets: F) -> ApiResult<Backup>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let (stored, revision) = read_all(registry).await?;
    let mut readable: BTreeMap<String, bool> = BTreeMap::new();
    let mut items = Vec::with_capacity(stored.len());
    for (def, mut s) in stored {
        let (namespace, name) = names(&s.value);
        let mut redacted = false;
        if has_inline_cloud_init(&s.value) {
            let may = match readable.get(&namespace) {
                Some(m) => *m,
                None => {
                    let m = may_read_secrets(namespace.clone()).await;
                    readable.insert(namespace.clone(), m);
                    m
                }
            };
            if !may {
                redact_cloud_init(&mut s.value);
                redacted = true;
            }
        }
        items.push(BackupItem {
            resource: def.plural.to_string(),
            namespace,
            name,
            object: s.value,
            redacted,
        });
    }
    Ok(Backup {
        api_version: api_version(),
        kind: KIND.into(),
        metadata: BackupMeta {
            creation_timestamp: crate::objects::now_rfc3339(),
            resource_version: revision.to_string(),
        },
        items,
    })
}

/// Inline cloud-init fields: what a NoCloud or ConfigDrive volume carries itself.
const CLOUD_INIT_DATA: [&str; 4] = [
    "userData",
    "userDataBase64",
    "networkData",
    "networkDataBase64",
];

/// The volumes of an object: a VMI's, or a VM's template's.
fn volumes(o: &Value) -> &[Value] {
    o.pointer("/spec/template/spec/volumes")
        .or_else(|| o.pointer("/spec/volumes"))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Whether a cloud-init volume source (`cloudInitNoCloud`, `cloudInitConfigDrive`) carries
/// inline data.
fn has_inline_cloud_init(o: &Value) -> bool {
    volumes(o).iter().any(|v| {
        ["cloudInitNoCloud", "cloudInitConfigDrive"]
            .iter()
            .filter_map(|src| v.get(*src))
            .any(|src| CLOUD_INIT_DATA.iter().any(|f| src.get(*f).is_some()))
    })
}

/// Removes the inline cloud-init data of `o`.
fn redact_cloud_init(o: &mut Value) {
    let pointer = if o.pointer("/spec/template/spec/volumes").is_some() {
        "/spec/template/spec/volumes"
    } else {
        "/spec/volumes"
    };
    for v in o
        .pointer_mut(pointer)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        for src in ["cloudInitNoCloud", "cloudInitConfigDrive"] {
            if let Some(m) = v.get_mut(src).and_then(Value::as_object_mut) {
                for f in CLOUD_INIT_DATA {
                    m.remove(f);
                }
            }
        }
    }
}

fn names(v: &Value) -> (String, String) {
    let s = |p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (s("/metadata/namespace"), s("/metadata/name"))
}

fn uid(v: &Value) -> Option<&str> {
    v.pointer("/metadata/uid").and_then(Value::as_str)
}

/// Checks a backup document before anything is written: every field at fault, named.
pub fn validate(doc: &Value) -> Result<Backup, Vec<FieldError>> {
    let mut errors = Vec::new();
    if doc["kind"] != KIND {
        errors.push(FieldError::not_supported(
            "kind",
            doc["kind"].as_str().unwrap_or(""),
            &[KIND],
        ));
    }
    let version = api_version();
    if doc["apiVersion"] != version.as_str() {
        errors.push(FieldError::not_supported(
            "apiVersion",
            doc["apiVersion"].as_str().unwrap_or(""),
            &[&version],
        ));
    }
    let backup: Backup = match Backup::deserialize(doc) {
        Ok(b) => b,
        Err(e) => {
            errors.push(FieldError::invalid("items", "", &e.to_string()));
            return Err(errors);
        }
    };
    let mut seen = BTreeMap::new();
    for (i, item) in backup.items.iter().enumerate() {
        let field = |f: &str| format!("items[{i}].{f}");
        let Some(def) = ResourceDef::by_plural(&item.resource) else {
            let plurals: Vec<&str> = ResourceDef::stored().map(|d| d.plural).collect();
            errors.push(FieldError::not_supported(
                field("resource"),
                &item.resource,
                &plurals,
            ));
            continue;
        };
        let o = &item.object;
        if item.redacted {
            errors.push(FieldError::forbidden(
                field("redacted"),
                &format!(
                    "this item's cloud-init data was left out of the backup: its taker could \
                     not read Secrets in namespace {:?}; take the backup as a user who can",
                    item.namespace
                ),
            ));
        }
        if o["kind"] != def.kind {
            errors.push(FieldError::not_supported(
                field("object.kind"),
                o["kind"].as_str().unwrap_or(""),
                &[def.kind],
            ));
        }
        let (namespace, name) = names(o);
        if def.namespaced && (namespace != item.namespace || namespace.is_empty()) {
            errors.push(FieldError::invalid(
                field("object.metadata.namespace"),
                &namespace,
                &format!("must be the item's namespace {:?}", item.namespace),
            ));
        }
        // A cluster-scoped kind (the cluster instancetypes and preferences) has no namespace,
        // in its object or in its item.
        if !def.namespaced && !namespace.is_empty() {
            errors.push(FieldError::invalid(
                field("object.metadata.namespace"),
                &namespace,
                &format!("{} are cluster-scoped: leave it out", def.plural),
            ));
        }
        if !def.namespaced && !item.namespace.is_empty() {
            errors.push(FieldError::invalid(
                field("namespace"),
                &item.namespace,
                &format!("{} are cluster-scoped: leave it out", def.plural),
            ));
        }
        if name != item.name || name.is_empty() {
            errors.push(FieldError::invalid(
                field("object.metadata.name"),
                &name,
                &format!("must be the item's name {:?}", item.name),
            ));
        }
        if uid(o).is_none_or(str::is_empty) {
            errors.push(FieldError::required(
                field("object.metadata.uid"),
                "a backup keeps every object's uid",
            ));
        }
        errors.extend((def.validate)(o).into_iter().map(|mut e| {
            e.field = format!("{}.{}", field("object"), e.field);
            e
        }));
        if let Some(j) = seen.insert((def.plural, namespace, name), i) {
            errors.push(FieldError {
                kind: kubevirt_api::validation::ErrorType::Duplicate,
                field: field("name"),
                message: format!("Duplicate value: the same object as items[{j}]"),
            });
        }
    }
    if errors.is_empty() {
        Ok(backup)
    } else {
        Err(errors)
    }
}

/// One write of a restore.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    Create {
        key: String,
        value: Value,
    },
    Update {
        key: String,
        value: Value,
        expected: i64,
    },
    Delete {
        key: String,
        expected: i64,
    },
}

/// What a restore writes: `current` is every stored key with its object and revision,
/// `wanted` every key of the backup with its object.
pub fn plan(
    current: &BTreeMap<String, (Value, i64)>,
    wanted: &BTreeMap<String, Value>,
) -> (Vec<Write>, u64) {
    let mut writes = Vec::new();
    let mut unchanged = 0;
    for (key, want) in wanted {
        match current.get(key) {
            None => writes.push(Write::Create {
                key: key.clone(),
                value: created(want),
            }),
            // Another object under the backup's name (a VMI restarted since): deleted, then
            // the backup's created, never one turned into the other by an update. A watcher
            // keyed by name (every informer) would see only a modification and keep the
            // newer uid alive: Kubernetes' garbage collector would never collect its
            // launcher pod, and its guest would run on without a VMI (`cargo xtask chaos`).
            Some((now, rev))
                if uid(now).is_some() && uid(want).is_some() && uid(now) != uid(want) =>
            {
                writes.push(Write::Delete {
                    key: key.clone(),
                    expected: *rev,
                });
                writes.push(Write::Create {
                    key: key.clone(),
                    value: created(want),
                });
            }
            Some((now, rev)) => {
                let value = merged(now, want);
                if &value == now {
                    unchanged += 1;
                } else {
                    writes.push(Write::Update {
                        key: key.clone(),
                        value,
                        expected: *rev,
                    });
                }
            }
        }
    }
    for (key, (_, rev)) in current {
        if !wanted.contains_key(key) {
            writes.push(Write::Delete {
                key: key.clone(),
                expected: *rev,
            });
        }
    }
    (writes, unchanged)
}

/// The backup's object as created again: without status, which the components observe
/// anew, except a migration's final phase (a finished migration must not run again).
fn created(want: &Value) -> Value {
    let mut value = want.clone();
    let final_migration = want["kind"]
        == kubevirt_api::catalogue::VIRTUAL_MACHINE_INSTANCE_MIGRATION.kind
        && matches!(
            want.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
    if final_migration {
        value["status"] = serde_json::json!({"phase": want["status"]["phase"].clone()});
    } else if let Some(m) = value.as_object_mut() {
        m.remove("status");
    }
    value
}

/// The backup's object, with the current status when it is the same object (same uid).
fn merged(now: &Value, want: &Value) -> Value {
    let mut value = want.clone();
    if uid(now).is_some() && uid(now) == uid(want) {
        match now.get("status") {
            Some(s) => value["status"] = s.clone(),
            None => {
                if let Some(m) = value.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    value
}

/// What the stored objects decide about `backup` before anything is written: every item
/// passes the input policy as a component would write it (over the object stored under its
/// name, if any), and no item takes a uid another stored object has.
async fn check_against_store(registry: &Registry, backup: &Backup) -> ApiResult<()> {
    let current = read_all(registry).await?.0;
    let by_key: BTreeMap<&str, &Value> = current
        .iter()
        .map(|(_, s)| (s.key.as_str(), &s.value))
        .collect();
    let by_uid: BTreeMap<&str, &str> = current
        .iter()
        .filter_map(|(_, s)| Some((uid(&s.value)?, s.key.as_str())))
        .collect();
    let actor = kubevirt_api::policy::Actor::Component;
    let mut errors = Vec::new();
    for (i, item) in backup.items.iter().enumerate() {
        let Some(def) = ResourceDef::by_plural(&item.resource) else {
            continue;
        };
        let key = registry.object_key(def, &item.namespace, &item.name);
        let field = format!("items[{i}].object");
        if let Some(u) = uid(&item.object)
            && by_uid.get(u).is_some_and(|other| *other != key)
        {
            errors.push(FieldError::invalid(
                format!("{field}.metadata.uid"),
                u,
                "another stored object has this uid",
            ));
        }
        let old = by_key.get(key.as_str()).copied();
        errors.extend(
            registry
                .policy_errors(def, old, &item.object, &actor)
                .into_iter()
                .map(|mut e| {
                    e.field = format!("{field}.{}", e.field);
                    e
                }),
        );
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            kubevirt_api::backup::KIND,
            kubevirt_api::SUBRESOURCES_GROUP,
            "",
            &errors,
        ))
    }
}

/// Sets the stored objects back to `backup` (already validated).
pub async fn restore(registry: &Registry, backup: &Backup) -> ApiResult<RestoreResult> {
    let mut wanted = BTreeMap::new();
    let mut named = BTreeMap::new();
    for i in &backup.items {
        if let Some(def) = ResourceDef::by_plural(&i.resource) {
            let key = registry.object_key(def, &i.namespace, &i.name);
            wanted.insert(key.clone(), i.object.clone());
            named.insert(key, (def.plural, i.namespace.as_str(), i.name.as_str()));
        }
    }
    let mut result = RestoreResult {
        api_version: api_version(),
        kind: RESULT_KIND.into(),
        ..RestoreResult::default()
    };
    check_against_store(registry, backup).await?;
    // Each pass writes what differs; a pass that lost a compare-and-swap to a component's
    // write reads again and retries only what still differs.
    for attempt in 0..ATTEMPTS {
        let current: BTreeMap<String, (Value, i64)> = read_all(registry)
            .await?
            .0
            .into_iter()
            .map(|(_, s)| (s.key, (s.value, s.revision)))
            .collect();
        let (writes, unchanged) = plan(&current, &wanted);
        if attempt == 0 {
            result.unchanged = unchanged;
        }
        if writes.is_empty() {
            break;
        }
        let mut lost = 0;
        for w in writes {
            if let Write::Create { key, .. } = &w
                && let Some((plural, ns, name)) = named.get(key)
                && !ns.is_empty()
                && let Err(e) = registry.admit_namespace(ns, plural, name).await
            {
                // Not created into a namespace that is gone or going: nothing would ever
                // delete it there. Other failures (kube-apiserver unreachable) end the restore.
                if !matches!(e.code, 403 | 404) {
                    return Err(e);
                }
                result
                    .skipped
                    .push(format!("{plural} {ns}/{name}: {}", e.message));
                wanted.remove(key);
                continue;
            }
            let store = registry.storage();
            let (done, counter) = match &w {
                Write::Create { key, value } => {
                    (store.create(key, value).await, &mut result.created)
                }
                Write::Update {
                    key,
                    value,
                    expected,
                } => (
                    store.update(key, value, *expected).await,
                    &mut result.updated,
                ),
                Write::Delete { key, expected } => {
                    (store.delete(key, *expected).await, &mut result.deleted)
                }
            };
            match done.map_err(crate::rest::storage_error)? {
                Some(rev) => {
                    *counter += 1;
                    result.resource_version = rev.to_string();
                }
                None => lost += 1,
            }
        }
        if lost == 0 {
            break;
        }
        if attempt + 1 == ATTEMPTS {
            return Err(ApiError::conflict(
                crate::error::Gr {
                    resource: "restore",
                    group: kubevirt_api::SUBRESOURCES_GROUP,
                },
                "",
                &format!(
                    "{lost} objects kept changing while being restored; the restore is \
                     idempotent, run it again"
                ),
            ));
        }
    }
    if result.resource_version.is_empty() {
        result.resource_version = registry
            .storage()
            .current_revision()
            .await
            .map_err(crate::rest::storage_error)?
            .to_string();
    }
    tracing::info!(
        created = result.created,
        updated = result.updated,
        deleted = result.deleted,
        unchanged = result.unchanged,
        skipped = result.skipped.len(),
        backup_revision = %backup.metadata.resource_version,
        "restored a backup"
    );
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vm(name: &str, uid: &str, running: bool, status: &str) -> Value {
        json!({"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine",
            "metadata":{"name":name,"namespace":"ns","uid":uid},
            "spec":{"running":running,"template":{"spec":{}}},
            "status":{"printableStatus":status}})
    }

    #[test]
    fn plan_creates_deleted_sets_back_changed_and_deletes_new() {
        let current = BTreeMap::from([
            ("/r/a".to_string(), (vm("a", "1", true, "Running"), 10)),
            ("/r/b".to_string(), (vm("b", "2", true, "Running"), 11)),
            ("/r/new".to_string(), (vm("new", "9", false, "Stopped"), 12)),
        ]);
        let wanted = BTreeMap::from([
            // Unchanged but for status: the current status stays, nothing written.
            ("/r/a".to_string(), vm("a", "1", true, "Starting")),
            // Spec changed since: set back, current status kept.
            ("/r/b".to_string(), vm("b", "2", false, "Stopped")),
            // Deleted since: created again as it was.
            ("/r/gone".to_string(), vm("gone", "3", true, "Running")),
        ]);
        let (writes, unchanged) = plan(&current, &wanted);
        assert_eq!(unchanged, 1);
        let mut b = vm("b", "2", false, "Stopped");
        b["status"] = json!({"printableStatus":"Running"});
        assert_eq!(
            writes,
            vec![
                Write::Update {
                    key: "/r/b".into(),
                    value: b,
                    expected: 11
                },
                Write::Create {
                    key: "/r/gone".into(),
                    value: created(&vm("gone", "3", true, "Running"))
                },
                Write::Delete {
                    key: "/r/new".into(),
                    expected: 12
                },
            ]
        );
    }

    #[test]
    fn an_object_recreated_under_the_same_name_is_deleted_then_the_backups_created() {
        let current =
            BTreeMap::from([("/r/a".to_string(), (vm("a", "new-uid", true, "Running"), 5))]);
        let wanted = BTreeMap::from([("/r/a".to_string(), vm("a", "old-uid", false, "Stopped"))]);
        let (writes, _) = plan(&current, &wanted);
        assert_eq!(
            writes,
            vec![
                Write::Delete {
                    key: "/r/a".into(),
                    expected: 5
                },
                Write::Create {
                    key: "/r/a".into(),
                    value: created(&vm("a", "old-uid", false, "Stopped")),
                },
            ]
        );
    }

    #[test]
    fn inline_cloud_init_is_redacted_and_a_redacted_item_is_not_restored() {
        let mut v = json!({"kind": "VirtualMachine", "spec": {"template": {"spec": {"volumes": [
            {"name": "c", "cloudInitNoCloud": {"userData": "#cloud-config\npassword: x",
                "networkDataSecretRef": {"name": "n"}}},
            {"name": "d", "containerDisk": {"image": "i"}}]}}}});
        assert!(has_inline_cloud_init(&v));
        redact_cloud_init(&mut v);
        assert!(!has_inline_cloud_init(&v));
        assert_eq!(
            v["spec"]["template"]["spec"]["volumes"][0]["cloudInitNoCloud"],
            json!({"networkDataSecretRef": {"name": "n"}}),
            "references stay, data goes"
        );
        let vmi = json!({"kind": "VirtualMachineInstance", "spec": {"volumes": [
            {"name": "c", "cloudInitConfigDrive": {"userDataBase64": "eA=="}}]}});
        assert!(has_inline_cloud_init(&vmi));
        let doc = json!({"apiVersion": api_version(), "kind": KIND,
            "metadata": {"creationTimestamp": "", "resourceVersion": "1"},
            "items": [{"resource": "virtualmachines", "namespace": "ns", "name": "a", "redacted": true,
                "object": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                    "metadata": {"name": "a", "namespace": "ns", "uid": "u"},
                    "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}}}]});
        let errors = validate(&doc).unwrap_err();
        assert!(
            errors.iter().any(|e| e.field == "items[0].redacted"),
            "{errors:?}"
        );
    }

    #[test]
    fn an_object_created_again_has_no_status_but_a_finished_migration_its_phase() {
        assert!(
            created(&vm("a", "1", true, "Running"))
                .get("status")
                .is_none()
        );
        let done = json!({"kind": "VirtualMachineInstanceMigration",
            "status": {"phase": "Succeeded", "migrationState": {"targetNode": "x"}}});
        assert_eq!(created(&done)["status"], json!({"phase": "Succeeded"}));
        let running = json!({"kind": "VirtualMachineInstanceMigration",
            "status": {"phase": "Running"}});
        assert!(created(&running).get("status").is_none());
    }

    #[test]
    fn validation_names_every_field_at_fault() {
        let doc = json!({"apiVersion":"v1","kind":"List","metadata":{"creationTimestamp":"","resourceVersion":"1"},
        "items":[
            {"resource":"pods","namespace":"ns","name":"p","object":{}},
            {"resource":"virtualmachines","namespace":"ns","name":"a","object":
                {"kind":"VirtualMachine","metadata":{"name":"b","namespace":"ns"}}},
        ]});
        let errors = validate(&doc).unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        for f in [
            "kind",
            "apiVersion",
            "items[0].resource",
            "items[1].object.metadata.name",
            "items[1].object.metadata.uid",
        ] {
            assert!(fields.contains(&f), "{f} not in {fields:?}");
        }
    }

    #[test]
    fn a_cluster_scoped_item_has_no_namespace_and_a_namespaced_one_must_have_its_own() {
        let it = |ns: &str, obj_ns: Option<&str>| {
            let mut meta = json!({"name": "u1.small", "uid": "u"});
            if let Some(n) = obj_ns {
                meta["namespace"] = json!(n);
            }
            json!({"resource": "virtualmachineclusterinstancetypes", "namespace": ns,
                "name": "u1.small", "object": {"apiVersion": "instancetype.kubevirt.io/v1beta1",
                    "kind": "VirtualMachineClusterInstancetype", "metadata": meta,
                    "spec": {"cpu": {"guest": 1}, "memory": {"guest": "2Gi"}}}})
        };
        let doc = |items: Vec<Value>| {
            json!({"apiVersion": api_version(), "kind": KIND,
                "metadata": {"creationTimestamp": "", "resourceVersion": "1"}, "items": items})
        };
        let ok = validate(&doc(vec![it("", None)]));
        assert!(ok.is_ok(), "{ok:?}");
        let errors = validate(&doc(vec![it("ns", Some("ns"))])).unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"items[0].namespace"), "{fields:?}");
        assert!(
            fields.contains(&"items[0].object.metadata.namespace"),
            "{fields:?}"
        );
    }
}
