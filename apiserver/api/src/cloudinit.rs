//! How cloud-init data travels from a VMI to its launcher without being readable by
//! everyone who can read pods (issue 15 point 5).
//!
//! User data often holds passwords and keys. The launcher pod carries its VMI as an
//! annotation, which the `view` role reads; so virt-controller moves the inline data out
//! ([`take_inline`]) into a Secret of its own whose keys are [`inline_key`]s, and mounts the
//! Secrets a VMI names (`secretRef`, `networkDataSecretRef`) as they are, each in a
//! directory named by [`ref_dir`]. virt-launcher puts both back into the spec it loaded
//! ([`restore_inline`], [`restore_refs`]) before anything else reads it. Both ends use this
//! module, so the names cannot drift apart.

use std::collections::BTreeMap;

use crate::vmi::{CloudInitSource, VirtualMachineInstanceSpec};

/// Keys KubeVirt reads user data from in a `secretRef` Secret, in order.
pub const USER_DATA_KEYS: [&str; 2] = ["userdata", "userData"];
/// Keys KubeVirt reads network data from in a `networkDataSecretRef` Secret, in order.
pub const NETWORK_DATA_KEYS: [&str; 2] = ["networkdata", "networkData"];
/// Directory (below the launcher's cloud-init directory) of the Secret of inline data.
pub const INLINE_DIR: &str = "inline";

/// Which data a referenced Secret holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefKind {
    /// `secretRef`: user data.
    User,
    /// `networkDataSecretRef`: network data.
    Network,
}

/// The name of the launcher's Secret of inline data for the VMI with `uid`.
pub fn secret_name(uid: &str) -> String {
    format!("kubevirt-rs-cloud-init-{uid}")
}

/// The Secret key of an inline field (`userData`, `userDataBase64`, `networkData`,
/// `networkDataBase64`) of `volume`. Volume names are DNS-1123 labels, so this is a valid
/// key.
pub fn inline_key(volume: &str, field: &str) -> String {
    format!("{volume}.{field}")
}

/// The directory name a referenced Secret of `volume` is mounted under.
pub fn ref_dir(volume: &str, kind: RefKind) -> String {
    match kind {
        RefKind::User => format!("{volume}.user"),
        RefKind::Network => format!("{volume}.network"),
    }
}

fn sources_mut(
    spec: &mut VirtualMachineInstanceSpec,
) -> impl Iterator<Item = (&str, &mut CloudInitSource)> {
    spec.volumes.iter_mut().flatten().flat_map(|v| {
        let name = v.name.as_str();
        [
            v.cloud_init_no_cloud.as_mut(),
            v.cloud_init_config_drive.as_mut(),
        ]
        .into_iter()
        .flatten()
        .map(move |s| (name, s))
    })
}

fn inline_fields(s: &mut CloudInitSource) -> [(&'static str, &mut Option<String>); 4] {
    [
        ("userData", &mut s.user_data),
        ("userDataBase64", &mut s.user_data_base64),
        ("networkData", &mut s.network_data),
        ("networkDataBase64", &mut s.network_data_base64),
    ]
}

/// Removes every inline cloud-init field from `spec`; returns them keyed by [`inline_key`]
/// (empty when the spec has none).
pub fn take_inline(spec: &mut VirtualMachineInstanceSpec) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (volume, source) in sources_mut(spec) {
        for (field, value) in inline_fields(source) {
            if let Some(v) = value.take() {
                out.insert(inline_key(volume, field), v);
            }
        }
    }
    out
}

/// Puts inline data back: every field whose [`inline_key`] `get` finds.
pub fn restore_inline(spec: &mut VirtualMachineInstanceSpec, get: impl Fn(&str) -> Option<String>) {
    for (volume, source) in sources_mut(spec) {
        for (field, value) in inline_fields(source) {
            if value.is_none()
                && let Some(v) = get(&inline_key(volume, field))
            {
                *value = Some(v);
            }
        }
    }
}

/// Replaces each Secret reference by the data it holds; `read(dir, key)` reads a key of
/// the Secret mounted in [`ref_dir`]. An error names the volume, the Secret and the keys
/// looked for.
pub fn restore_refs(
    spec: &mut VirtualMachineInstanceSpec,
    read: impl Fn(&str, &str) -> Option<String>,
) -> Result<(), String> {
    for (volume, source) in sources_mut(spec) {
        let refs = [
            (
                RefKind::User,
                &mut source.secret_ref,
                &mut source.user_data,
                USER_DATA_KEYS,
            ),
            (
                RefKind::Network,
                &mut source.network_data_secret_ref,
                &mut source.network_data,
                NETWORK_DATA_KEYS,
            ),
        ];
        for (kind, secret, data, keys) in refs {
            let Some(r) = secret.as_ref() else { continue };
            let dir = ref_dir(volume, kind);
            let Some(v) = keys.iter().find_map(|k| read(&dir, k)) else {
                return Err(format!(
                    "volume {volume}: Secret {:?} has no key {}",
                    r.name,
                    keys.join(" or ")
                ));
            };
            *data = Some(v);
            *secret = None;
        }
    }
    Ok(())
}

/// The directory (below the launcher's access-credentials directory) a credential's Secret
/// is mounted in: KubeVirt's `<secret>-access-cred`.
pub fn access_credential_dir(secret: &str) -> String {
    format!("{secret}-access-cred")
}

/// The guest's host name as KubeVirt's `SanitizeHostname` makes it: `spec.hostname`, else the
/// VMI's name up to its first dot, at most 63 characters.
pub fn hostname(vmi: &crate::VirtualMachineInstance) -> String {
    if let Some(h) = vmi.spec.hostname.as_deref().filter(|h| !h.is_empty()) {
        return h.to_string();
    }
    let name = vmi.metadata.name.as_deref().unwrap_or_default();
    let first = name.split('.').next().unwrap_or_default();
    first.chars().take(63).collect()
}

/// The SMBIOS (firmware) UUID of the VMI: defaulted from the VM's name, so the same for every
/// start of the same VM (`defaults::default_vmi` sets it).
fn firmware_uuid(vmi: &crate::VirtualMachineInstance) -> String {
    vmi.spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.uuid.clone())
        .unwrap_or_default()
}

/// SSH keys as cloud-init's metadata lists them: `{"0": key, "1": key, …}`.
fn public_keys(keys: &[String]) -> serde_json::Map<String, serde_json::Value> {
    keys.iter()
        .enumerate()
        .map(|(i, k)| (i.to_string(), serde_json::Value::String(k.clone())))
        .collect()
}

/// NoCloud `meta-data`, as KubeVirt writes it (JSON, which is YAML): `instance-id` is the
/// firmware UUID — stable across restarts of the same VM, so cloud-init runs its first-boot
/// modules once — `local-hostname` the [`hostname`], and `public-keys` the SSH keys of the
/// `noCloud` access credentials.
pub fn nocloud_meta_data(
    vmi: &crate::VirtualMachineInstance,
    keys: &[String],
) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("instance-id".into(), firmware_uuid(vmi).into());
    m.insert("local-hostname".into(), hostname(vmi).into());
    if !keys.is_empty() {
        m.insert("public-keys".into(), public_keys(keys).into());
    }
    m.into()
}

/// ConfigDrive `openstack/latest/meta_data.json`, as KubeVirt writes it: `instance_id` is
/// `<name>.<namespace>` and `uuid` the firmware UUID (both stable for a VM), `hostname`
/// the [`hostname`], `public_keys` the keys of the `configDrive` access credentials.
pub fn config_drive_meta_data(
    vmi: &crate::VirtualMachineInstance,
    keys: &[String],
) -> serde_json::Value {
    let name = vmi.metadata.name.as_deref().unwrap_or_default();
    let ns = vmi.metadata.namespace.as_deref().unwrap_or("default");
    let mut m = serde_json::Map::new();
    m.insert("instance_id".into(), format!("{name}.{ns}").into());
    m.insert("hostname".into(), hostname(vmi).into());
    m.insert("uuid".into(), firmware_uuid(vmi).into());
    if !keys.is_empty() {
        m.insert("public_keys".into(), public_keys(keys).into());
    }
    m.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_kubevirts_and_stable_for_a_vm() {
        let vmi = |uid: &str| {
            let mut v: crate::VirtualMachineInstance = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web.example", "namespace": "ns1", "uid": uid},
                "spec": {"domain": {"devices": {}}}
            }))
            .unwrap();
            crate::defaults::default_vmi(&mut v);
            v
        };
        let (a, b) = (vmi("uid-1"), vmi("uid-2"));
        let meta = nocloud_meta_data(&a, &[]);
        assert_eq!(meta, nocloud_meta_data(&b, &[]), "a new VMI of the same VM");
        assert_eq!(meta["local-hostname"], "web");
        let id = meta["instance-id"].as_str().unwrap();
        assert_eq!(id.len(), 36, "a UUID: {id}");
        assert!(meta.get("public-keys").is_none());
        let keyed = nocloud_meta_data(&a, &["ssh-ed25519 AAAA a".into(), "ssh-rsa B b".into()]);
        assert_eq!(
            keyed["public-keys"],
            serde_json::json!({"0": "ssh-ed25519 AAAA a", "1": "ssh-rsa B b"})
        );
        let cd = config_drive_meta_data(&a, &["k".into()]);
        assert_eq!(cd["instance_id"], "web.example.ns1");
        assert_eq!(cd["uuid"], id);
        assert_eq!(cd["hostname"], "web");
        assert_eq!(cd["public_keys"]["0"], "k");
        let mut named = a.clone();
        named.spec.hostname = Some("db".into());
        assert_eq!(hostname(&named), "db");
        named.spec.hostname = None;
        named.metadata.name = Some("x".repeat(70));
        assert_eq!(hostname(&named).len(), 63);
        assert_eq!(access_credential_dir("keys"), "keys-access-cred");
    }

    fn spec() -> VirtualMachineInstanceSpec {
        serde_json::from_value(serde_json::json!({
            "domain": {"devices": {}},
            "volumes": [
                {"name": "ci", "cloudInitNoCloud": {
                    "userData": "#cloud-config\npassword: hunter2\n",
                    "networkDataBase64": "bmV0"
                }},
                {"name": "ref", "cloudInitNoCloud": {
                    "secretRef": {"name": "my-user-data"},
                    "networkDataSecretRef": {"name": "my-net"}
                }},
                {"name": "disk", "containerDisk": {"image": "x"}}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn inline_data_leaves_the_spec_and_comes_back_whole() {
        let original = spec();
        let mut stripped = original.clone();
        let taken = take_inline(&mut stripped);
        assert_eq!(
            taken.keys().collect::<Vec<_>>(),
            ["ci.networkDataBase64", "ci.userData"]
        );
        let json = serde_json::to_string(&stripped).unwrap();
        assert!(
            !json.contains("hunter2") && !json.contains("bmV0"),
            "{json}"
        );
        // References are not data: they stay for the launcher.
        assert!(json.contains("my-user-data"));
        let mut back = stripped;
        restore_inline(&mut back, |k| taken.get(k).cloned());
        assert_eq!(back, original);
    }

    #[test]
    fn references_become_data_or_name_what_is_missing() {
        let mut s = spec();
        restore_refs(&mut s, |dir, key| match (dir, key) {
            ("ref.user", "userData") => Some("#cloud-config\n".into()),
            ("ref.network", "networkdata") => Some("version: 2\n".into()),
            _ => None,
        })
        .unwrap();
        let src = s.volumes.as_ref().unwrap()[1]
            .cloud_init_no_cloud
            .clone()
            .unwrap();
        assert_eq!(src.user_data.as_deref(), Some("#cloud-config\n"));
        assert_eq!(src.network_data.as_deref(), Some("version: 2\n"));
        assert!(src.secret_ref.is_none() && src.network_data_secret_ref.is_none());

        let err = restore_refs(&mut spec(), |_, _| None).unwrap_err();
        assert_eq!(
            err,
            "volume ref: Secret \"my-user-data\" has no key userdata or userData"
        );
    }
}
