//! Validation of kubevirt.io/v1 objects: pure functions returning every field error,
//! in Kubernetes' wording, so the API server can answer 422 with one cause per field.

use std::collections::HashSet;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::migration::VirtualMachineInstanceMigration;
use crate::quantity;
use crate::vm::VirtualMachine;
use crate::vmi::{VirtualMachineInstance, VirtualMachineInstanceSpec};

/// Kind of a field error, mapped to Kubernetes' `CauseType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorType {
    /// `FieldValueRequired`.
    Required,
    /// `FieldValueInvalid`.
    Invalid,
    /// `FieldValueNotSupported`.
    NotSupported,
    /// `FieldValueDuplicate`.
    Duplicate,
    /// `FieldValueForbidden`.
    Forbidden,
    /// `FieldValueTooLong`.
    TooLong,
    /// `FieldValueNotFound`.
    NotFound,
    /// `FieldValueTypeInvalid`.
    TypeInvalid,
}

impl ErrorType {
    /// The `reason` of the Status cause.
    pub fn cause_type(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::NotSupported => "FieldValueNotSupported",
            Self::Duplicate => "FieldValueDuplicate",
            Self::Forbidden => "FieldValueForbidden",
            Self::TooLong => "FieldValueTooLong",
            Self::NotFound => "FieldValueNotFound",
            Self::TypeInvalid => "FieldValueTypeInvalid",
        }
    }
}

/// One invalid field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// What is wrong.
    pub kind: ErrorType,
    /// Dotted JSON path with `[i]` indexes, e.g. `spec.template.spec.volumes[0].name`.
    pub field: String,
    /// Message without the field path, in Kubernetes' wording (`Required value`, …).
    pub message: String,
}

impl FieldError {
    /// `Required value[: detail]`.
    pub fn required(field: impl Into<String>, detail: &str) -> Self {
        let message = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        Self {
            kind: ErrorType::Required,
            field: field.into(),
            message,
        }
    }

    /// `Invalid value: "v": detail`.
    pub fn invalid(field: impl Into<String>, value: &str, detail: &str) -> Self {
        Self {
            kind: ErrorType::Invalid,
            field: field.into(),
            message: format!("Invalid value: {value:?}: {detail}"),
        }
    }

    /// `Unsupported value: "v": supported values: "a", "b"`.
    pub fn not_supported(field: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self {
            kind: ErrorType::NotSupported,
            field: field.into(),
            message: format!(
                "Unsupported value: {value:?}: supported values: {}",
                list.join(", ")
            ),
        }
    }

    /// `Duplicate value: "v"`.
    pub fn duplicate(field: impl Into<String>, value: &str) -> Self {
        Self {
            kind: ErrorType::Duplicate,
            field: field.into(),
            message: format!("Duplicate value: {value:?}"),
        }
    }

    /// `Forbidden: detail`.
    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Self {
            kind: ErrorType::Forbidden,
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }

    /// `Too long: may not be more than N bytes`.
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        Self {
            kind: ErrorType::TooLong,
            field: field.into(),
            message: format!("Too long: may not be more than {max} bytes"),
        }
    }

    /// `Not found: "v"`.
    pub fn not_found(field: impl Into<String>, value: &str) -> Self {
        Self {
            kind: ErrorType::NotFound,
            field: field.into(),
            message: format!("Not found: {value:?}"),
        }
    }

    /// `Invalid value: "type": detail` for a value of the wrong JSON type.
    pub fn type_invalid(field: impl Into<String>, detail: &str) -> Self {
        Self {
            kind: ErrorType::TypeInvalid,
            field: field.into(),
            message: format!("Invalid value: {detail}"),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;

fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= DNS1123_LABEL_MAX
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// KubeVirt's wording for a name that must be a DNS-1123 label (Kubernetes'
/// `IsDNS1123Label` message).
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', \
     and must start and end with an alphanumeric character (e.g. 'my-name', or '123-abc', regex used for \
     validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// Volume, disk, interface and network names are DNS-1123 labels: the launcher uses a
/// volume's name as a file name in its work directory (`../x` would leave it) and
/// libvirt aliases are built from disk and interface names.
fn check_name(errs: &mut Vec<FieldError>, field: String, name: &str) {
    if !name.is_empty() && !is_dns1123_label(name) {
        errs.push(FieldError::invalid(field, name, DNS1123_LABEL_MSG));
    }
}

/// hostDisk rules (KubeVirt's, plus what the node needs to stay safe): a type of `Disk`
/// (the image must exist) or `DiskOrCreate` (created with `capacity`, which is then
/// required and only then allowed), an absolute path without `..` components so the
/// path names exactly what the admin who enabled the gate expects.
fn check_host_disk(errs: &mut Vec<FieldError>, p: &str, hd: &crate::vmi::HostDisk) {
    let p = format!("{p}.hostDisk");
    if hd.path.is_empty() {
        errs.push(FieldError::required(format!("{p}.path"), ""));
    } else if !hd.path.starts_with('/') {
        errs.push(FieldError::invalid(
            format!("{p}.path"),
            &hd.path,
            "must be an absolute path",
        ));
    } else if hd.path.split('/').any(|c| c == "..") {
        errs.push(FieldError::invalid(
            format!("{p}.path"),
            &hd.path,
            "must not contain '..'",
        ));
    }
    match hd.type_.as_str() {
        "Disk" => {
            if hd.capacity.is_some() {
                errs.push(FieldError::forbidden(
                    format!("{p}.capacity"),
                    "only allowed with type DiskOrCreate",
                ));
            }
        }
        "DiskOrCreate" => match &hd.capacity {
            None => errs.push(FieldError::required(
                format!("{p}.capacity"),
                "type DiskOrCreate creates the image with this size",
            )),
            Some(c) => {
                if quantity::parse_bytes(&c.0).map(|b| b == 0).unwrap_or(true) {
                    errs.push(FieldError::invalid(
                        format!("{p}.capacity"),
                        &c.0,
                        "must be a positive quantity",
                    ));
                }
            }
        },
        "" => errs.push(FieldError::required(format!("{p}.type"), "")),
        other => errs.push(FieldError::not_supported(
            format!("{p}.type"),
            other,
            &["Disk", "DiskOrCreate"],
        )),
    }
}

/// Errors of a DNS-1123 subdomain (object names), empty if valid.
pub fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    if s.is_empty() || !s.split('.').all(is_dns1123_label) {
        errs.push(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', \
             and must start and end with an alphanumeric character (e.g. 'example.com', regex used for \
             validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                .to_string(),
        );
    }
    errs
}

fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !dns1123_subdomain_errors(p).is_empty()
    {
        return false;
    }
    is_label_value(name) && !name.is_empty()
}

fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && v.as_bytes()[0].is_ascii_alphanumeric()
            && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric())
}

/// Validates object metadata as kube-apiserver does for every namespaced object.
/// `name_required` is false when `generateName` will supply the name later.
pub fn validate_object_meta(meta: &ObjectMeta, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match meta.name.as_deref() {
        None | Some("") => {
            if meta.generate_name.as_deref().unwrap_or("").is_empty() {
                errs.push(FieldError::required(
                    format!("{path}.name"),
                    "name or generateName is required",
                ));
            }
        }
        Some(name) => {
            for e in dns1123_subdomain_errors(name) {
                errs.push(FieldError::invalid(format!("{path}.name"), name, &e));
            }
        }
    }
    if let Some(labels) = &meta.labels {
        for (k, v) in labels {
            if !is_qualified_name(k) {
                errs.push(FieldError::invalid(
                    format!("{path}.labels"),
                    k,
                    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                ));
            }
            if !is_label_value(v) {
                errs.push(FieldError::invalid(
                    format!("{path}.labels"),
                    v,
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                ));
            }
        }
    }
    if let Some(ann) = &meta.annotations {
        let mut total = 0usize;
        for (k, v) in ann {
            total += k.len() + v.len();
            if !is_qualified_name(k) {
                errs.push(FieldError::invalid(
                    format!("{path}.annotations"),
                    k,
                    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                ));
            }
        }
        if total > 256 * 1024 {
            errs.push(FieldError::too_long(
                format!("{path}.annotations"),
                256 * 1024,
            ));
        }
    }
    if let Some(refs) = &meta.owner_references {
        let controllers = refs.iter().filter(|r| r.controller == Some(true)).count();
        if controllers > 1 {
            errs.push(FieldError::invalid(
                format!("{path}.ownerReferences"),
                "",
                "Only one reference can have Controller set to true",
            ));
        }
        for (i, r) in refs.iter().enumerate() {
            let p = format!("{path}.ownerReferences[{i}]");
            if r.api_version.is_empty() {
                errs.push(FieldError::invalid(
                    format!("{p}.apiVersion"),
                    "",
                    "version must not be empty",
                ));
            }
            if r.kind.is_empty() {
                errs.push(FieldError::invalid(
                    format!("{p}.kind"),
                    "",
                    "kind must not be empty",
                ));
            }
            if r.name.is_empty() {
                errs.push(FieldError::invalid(
                    format!("{p}.name"),
                    "",
                    "name must not be empty",
                ));
            }
            if r.uid.is_empty() {
                errs.push(FieldError::invalid(
                    format!("{p}.uid"),
                    "",
                    "uid must not be empty",
                ));
            }
        }
    }
    if let Some(fins) = &meta.finalizers {
        for (i, f) in fins.iter().enumerate() {
            if !is_qualified_name(f) {
                errs.push(FieldError::invalid(
                    format!("{path}.finalizers[{i}]"),
                    f,
                    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                ));
            }
        }
        if fins.iter().any(|f| f == "orphan") && fins.iter().any(|f| f == "foregroundDeletion") {
            errs.push(FieldError::invalid(
                format!("{path}.finalizers"),
                "foregroundDeletion",
                "finalizer orphan and foregroundDeletion cannot be both set",
            ));
        }
    }
    errs
}

/// KubeVirt's rules for `accessCredentials`: one source and one propagation method each,
/// users for the guest agent's keys, and the cloud-init volume a boot-time method writes to.
fn validate_access_credentials(spec: &VirtualMachineInstanceSpec, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    let no_cloud = volumes.iter().any(|v| v.cloud_init_no_cloud.is_some());
    let config_drive = volumes.iter().any(|v| v.cloud_init_config_drive.is_some());
    for (i, c) in spec.access_credentials.iter().flatten().enumerate() {
        let at = format!("{path}.accessCredentials[{i}]");
        match (&c.ssh_public_key, &c.user_password) {
            (Some(_), Some(_)) | (None, None) => errs.push(FieldError::invalid(
                at.clone(),
                "",
                "must have exactly one of sshPublicKey or userPassword set",
            )),
            _ => {}
        }
        let secret_ok = |s: &Option<crate::vmi::AccessCredentialSecretSource>| {
            s.as_ref().is_some_and(|s| !s.secret_name.is_empty())
        };
        if let Some(k) = &c.ssh_public_key {
            if !secret_ok(&k.source.secret) {
                errs.push(FieldError::invalid(
                    format!("{at}.sshPublicKey.source"),
                    "",
                    &format!("{at} must have exactly one source set"),
                ));
            }
            let m = &k.propagation_method;
            let count = [
                m.no_cloud.is_some(),
                m.config_drive.is_some(),
                m.qemu_guest_agent.is_some(),
            ]
            .into_iter()
            .filter(|b| *b)
            .count();
            if count != 1 {
                errs.push(FieldError::invalid(
                    format!("{at}.sshPublicKey.propagationMethod"),
                    "",
                    &format!("{at} must have exactly one propagationMethod set"),
                ));
            }
            if m.no_cloud.is_some() && !no_cloud {
                errs.push(FieldError::invalid(
                    format!("{at}.sshPublicKey.propagationMethod"),
                    "",
                    &format!("{at} requires a noCloud volume to exist when the noCloud propagationMethod is in use."),
                ));
            }
            if m.config_drive.is_some() && !config_drive {
                errs.push(FieldError::invalid(
                    format!("{at}.sshPublicKey.propagationMethod"),
                    "",
                    &format!("{at} requires a configDrive volume to exist when the configDrive propagationMethod is in use."),
                ));
            }
            if m.qemu_guest_agent
                .as_ref()
                .is_some_and(|q| q.users.is_empty())
            {
                errs.push(FieldError::invalid(
                    format!("{at}.sshPublicKey.propagationMethod.qemuGuestAgent.users"),
                    "",
                    &format!("{at} requires at least one user to be present in the users list"),
                ));
            }
        }
        if let Some(p) = &c.user_password {
            if !secret_ok(&p.source.secret) {
                errs.push(FieldError::invalid(
                    format!("{at}.userPassword.source"),
                    "",
                    &format!("{at} must have exactly one source set"),
                ));
            }
            if p.propagation_method.qemu_guest_agent.is_none() {
                errs.push(FieldError::invalid(
                    format!("{at}.userPassword.propagationMethod"),
                    "",
                    &format!("{at} must have exactly one propagationMethod set"),
                ));
            }
        }
    }
    errs
}

/// A probe has exactly one handler (KubeVirt's rule).
fn validate_probes(spec: &VirtualMachineInstanceSpec, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (field, p) in [
        ("readinessProbe", &spec.readiness_probe),
        ("livenessProbe", &spec.liveness_probe),
    ] {
        let Some(p) = p else { continue };
        let handlers = [
            p.exec.is_some(),
            p.guest_agent_ping.is_some(),
            p.http_get.is_some(),
            p.tcp_socket.is_some(),
        ]
        .into_iter()
        .filter(|b| *b)
        .count();
        if handlers != 1 {
            errs.push(FieldError::invalid(
                format!("{path}.{field}"),
                "",
                "either exec, httpGet, tcpSocket or guestAgentPing must be set, and only one",
            ));
        }
    }
    errs
}

/// Validates a VMI spec found at `path`.
pub fn validate_vmi_spec(spec: &VirtualMachineInstanceSpec, path: &str) -> Vec<FieldError> {
    let mut errs = validate_access_credentials(spec, path);
    errs.extend(validate_probes(spec, path));
    let domain = format!("{path}.domain");

    // Memory: the guest needs a size from somewhere, and every quantity must parse.
    let guest = spec.domain.memory.as_ref().and_then(|m| m.guest.as_ref());
    let requests = spec
        .domain
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref());
    let limits = spec
        .domain
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref());
    if let Some(q) = guest
        && let Err(e) = quantity::parse_bytes(&q.0)
    {
        errs.push(FieldError::invalid(
            format!("{domain}.memory.guest"),
            &q.0,
            &e.to_string(),
        ));
    }
    for (which, map) in [("requests", requests), ("limits", limits)] {
        if let Some(map) = map {
            for (k, q) in map {
                if quantity::parse(&q.0).map(|v| v < 0.0).unwrap_or(true) {
                    errs.push(FieldError::invalid(
                        format!("{domain}.resources.{which}.{k}"),
                        &q.0,
                        &quantity::QuantityError.to_string(),
                    ));
                }
            }
        }
    }
    let has_memory = guest.is_some()
        || requests.is_some_and(|r| r.contains_key("memory"))
        || limits.is_some_and(|r| r.contains_key("memory"));
    if !has_memory {
        errs.push(FieldError::required(
            format!("{domain}.resources.requests.memory"),
            "no memory requested, at least one of 'domain.memory.guest', 'domain.resources.requests.memory' or 'domain.resources.limits.memory' must be set",
        ));
    }
    if let (Some(g), Some(l)) = (guest, limits.and_then(|l| l.get("memory")))
        && let (Ok(g), Ok(l)) = (quantity::parse_bytes(&g.0), quantity::parse_bytes(&l.0))
        && g > l
    {
        errs.push(FieldError::invalid(
            format!("{domain}.memory.guest"),
            &g.to_string(),
            "must not be greater than the memory limit",
        ));
    }
    if let Some(cpu) = &spec.domain.cpu {
        for (f, v) in [
            ("cores", cpu.cores),
            ("sockets", cpu.sockets),
            ("threads", cpu.threads),
        ] {
            if v == Some(0) {
                errs.push(FieldError::invalid(
                    format!("{domain}.cpu.{f}"),
                    "0",
                    "must be greater than 0",
                ));
            }
        }
    }
    if let Some(t) = spec.termination_grace_period_seconds
        && t < 0
    {
        errs.push(FieldError::invalid(
            format!("{path}.terminationGracePeriodSeconds"),
            &t.to_string(),
            "must be greater than or equal to 0",
        ));
    }

    // Volumes: unique names, exactly one source each, valid sources.
    let volumes = spec.volumes.as_deref().unwrap_or(&[]);
    let mut volume_names = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let p = format!("{path}.volumes[{i}]");
        if v.name.is_empty() {
            errs.push(FieldError::required(format!("{p}.name"), ""));
        } else if !volume_names.insert(v.name.as_str()) {
            errs.push(FieldError::duplicate(format!("{p}.name"), &v.name));
        }
        check_name(&mut errs, format!("{p}.name"), &v.name);
        if let Some(hd) = &v.host_disk {
            check_host_disk(&mut errs, &p, hd);
        }
        let sources = v.source_names();
        match sources.len() {
            0 => errs.push(FieldError::required(
                p.clone(),
                "must specify exactly 1 volume type",
            )),
            1 => {}
            _ => errs.push(FieldError::forbidden(
                p.clone(),
                &format!(
                    "may not specify more than 1 volume type, found {}",
                    sources.join(", ")
                ),
            )),
        }
        if let Some(cd) = &v.container_disk
            && cd.image.is_empty()
        {
            errs.push(FieldError::required(format!("{p}.containerDisk.image"), ""));
        }
        if let Some(ed) = &v.empty_disk
            && quantity::parse_bytes(&ed.capacity.0)
                .map(|b| b == 0)
                .unwrap_or(true)
        {
            errs.push(FieldError::invalid(
                format!("{p}.emptyDisk.capacity"),
                &ed.capacity.0,
                "must be a positive quantity",
            ));
        }
        if let Some(pvc) = &v.persistent_volume_claim
            && pvc.claim_name.is_empty()
        {
            errs.push(FieldError::required(
                format!("{p}.persistentVolumeClaim.claimName"),
                "",
            ));
        }
        if let Some(ci) = &v.cloud_init_no_cloud {
            let sources = [
                ci.user_data.is_some(),
                ci.user_data_base64.is_some(),
                ci.secret_ref.is_some(),
            ];
            let nets = [
                ci.network_data.is_some(),
                ci.network_data_base64.is_some(),
                ci.network_data_secret_ref.is_some(),
            ];
            if sources.iter().filter(|b| **b).count() > 1 {
                errs.push(FieldError::forbidden(
                    format!("{p}.cloudInitNoCloud"),
                    "must have only one of userData, userDataBase64 or secretRef",
                ));
            }
            if nets.iter().filter(|b| **b).count() > 1 {
                errs.push(FieldError::forbidden(
                    format!("{p}.cloudInitNoCloud"),
                    "must have only one of networkData, networkDataBase64 or networkDataSecretRef",
                ));
            }
            if sources.iter().all(|b| !b) && nets.iter().all(|b| !b) {
                errs.push(FieldError::required(
                    format!("{p}.cloudInitNoCloud"),
                    "must have one of userData, userDataBase64, secretRef, networkData, networkDataBase64 or networkDataSecretRef",
                ));
            }
        }
    }

    // Disks: unique names, each backed by a volume, one target type, unique boot orders.
    let disks = spec.domain.devices.disks.as_deref().unwrap_or(&[]);
    let mut disk_names = HashSet::new();
    let mut boot_orders = HashSet::new();
    for (i, d) in disks.iter().enumerate() {
        let p = format!("{domain}.devices.disks[{i}]");
        if d.name.is_empty() {
            errs.push(FieldError::required(format!("{p}.name"), ""));
            continue;
        }
        if !disk_names.insert(d.name.as_str()) {
            errs.push(FieldError::duplicate(format!("{p}.name"), &d.name));
        }
        check_name(&mut errs, format!("{p}.name"), &d.name);
        if !volume_names.contains(d.name.as_str()) {
            errs.push(FieldError::not_found(format!("{p}.name"), &d.name));
        }
        let targets = [d.disk.is_some(), d.cdrom.is_some(), d.lun.is_some()]
            .iter()
            .filter(|b| **b)
            .count();
        if targets > 1 {
            errs.push(FieldError::forbidden(
                p.clone(),
                "may not specify more than one of disk, cdrom or lun",
            ));
        }
        if let Some(order) = d.boot_order {
            if order == 0 {
                errs.push(FieldError::invalid(
                    format!("{p}.bootOrder"),
                    "0",
                    "must be greater than 0",
                ));
            } else if !boot_orders.insert(order) {
                errs.push(FieldError::duplicate(
                    format!("{p}.bootOrder"),
                    &order.to_string(),
                ));
            }
        }
    }

    // Networks and interfaces: unique names and a network for every interface.
    let networks = spec.networks.as_deref().unwrap_or(&[]);
    let mut network_names = HashSet::new();
    for (i, n) in networks.iter().enumerate() {
        let p = format!("{path}.networks[{i}]");
        if n.name.is_empty() {
            errs.push(FieldError::required(format!("{p}.name"), ""));
        } else if !network_names.insert(n.name.as_str()) {
            errs.push(FieldError::duplicate(format!("{p}.name"), &n.name));
        }
        check_name(&mut errs, format!("{p}.name"), &n.name);
        let kinds = [n.pod.is_some(), n.multus.is_some()]
            .iter()
            .filter(|b| **b)
            .count();
        if kinds != 1 {
            errs.push(FieldError::required(
                p.clone(),
                "should have exactly one network type (pod or multus)",
            ));
        }
    }
    let pod_networks: Vec<&str> = networks
        .iter()
        .filter(|n| n.pod.is_some())
        .map(|n| n.name.as_str())
        .collect();
    for (i, n) in networks.iter().enumerate() {
        let p = format!("{path}.networks[{i}]");
        if n.multus.is_some() {
            errs.push(FieldError::forbidden(
                format!("{p}.multus"),
                "Multus networks are not supported by kubevirt-rs; use the pod network",
            ));
        }
        if n.pod.is_some() && pod_networks.first() != Some(&n.name.as_str()) {
            errs.push(FieldError::forbidden(
                format!("{p}.pod"),
                "only one network may be the pod network",
            ));
        }
        if let Some(cidr) = n.pod.as_ref().and_then(|p| p.vm_network_cidr.as_deref())
            && !is_guest_cidr(cidr)
        {
            errs.push(FieldError::invalid(
                format!("{p}.pod.vmNetworkCIDR"),
                cidr,
                "must be an IPv4 CIDR of /30 or larger (room for the gateway and the guest)",
            ));
        }
    }
    let interfaces = spec.domain.devices.interfaces.as_deref().unwrap_or(&[]);
    let mut on_pod_network = 0;
    let mut iface_names = HashSet::new();
    for (i, iface) in interfaces.iter().enumerate() {
        let p = format!("{domain}.devices.interfaces[{i}]");
        if !iface_names.insert(iface.name.as_str()) {
            errs.push(FieldError::duplicate(format!("{p}.name"), &iface.name));
        }
        check_name(&mut errs, format!("{p}.name"), &iface.name);
        if !network_names.contains(iface.name.as_str()) {
            errs.push(FieldError::not_found(format!("{p}.name"), &iface.name));
        }
        let bindings = [
            iface.bridge.is_some(),
            iface.masquerade.is_some(),
            iface.sriov.is_some(),
            iface.passt_binding.is_some(),
            iface.binding.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if bindings > 1 {
            errs.push(FieldError::forbidden(
                p.clone(),
                "must have only one binding method",
            ));
        }
        if pod_networks.contains(&iface.name.as_str()) {
            on_pod_network += 1;
            if on_pod_network > 1 {
                errs.push(FieldError::forbidden(
                    format!("{p}.name"),
                    "more than one interface is connected to the pod network",
                ));
            }
            let unsupported = [
                (iface.sriov.is_some(), "sriov"),
                (iface.passt_binding.is_some(), "passtBinding"),
                (iface.binding.is_some(), "binding"),
            ];
            for (set, field) in unsupported {
                if set {
                    errs.push(FieldError::forbidden(
                        format!("{p}.{field}"),
                        "not supported on the pod network by kubevirt-rs (masquerade or bridge)",
                    ));
                }
            }
            if bindings == 0 {
                errs.push(FieldError::required(
                    p.clone(),
                    "an interface on the pod network needs a binding: masquerade or bridge",
                ));
            }
        }
        if iface.ports.as_ref().is_some_and(|p| !p.is_empty()) && iface.masquerade.is_none() {
            errs.push(FieldError::forbidden(
                format!("{p}.ports"),
                "ports are forwarded by the masquerade binding only",
            ));
        }
        for (j, port) in iface.ports.iter().flatten().enumerate() {
            if !(1..=65535).contains(&port.port) {
                errs.push(FieldError::invalid(
                    format!("{p}.ports[{j}].port"),
                    &port.port.to_string(),
                    "must be between 1 and 65535",
                ));
            }
            if let Some(proto) = &port.protocol
                && !matches!(proto.to_ascii_uppercase().as_str(), "TCP" | "UDP")
            {
                errs.push(FieldError::not_supported(
                    format!("{p}.ports[{j}].protocol"),
                    proto,
                    &["TCP", "UDP"],
                ));
            }
        }
        if let Some(mac) = &iface.mac_address
            && !is_mac(mac)
        {
            errs.push(FieldError::invalid(
                format!("{p}.macAddress"),
                mac,
                "must be a valid MAC address",
            ));
        }
    }

    if let Some(kb) = spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        && let Some(c) = &kb.container
    {
        let p = format!("{domain}.firmware.kernelBoot.container");
        if c.image.is_empty() {
            errs.push(FieldError::required(format!("{p}.image"), ""));
        }
        if c.kernel_path.is_none() && c.initrd_path.is_none() {
            errs.push(FieldError::required(
                p.clone(),
                "must specify at least one of kernelPath or initrdPath",
            ));
        }
    }
    errs
}

fn is_guest_cidr(s: &str) -> bool {
    s.split_once('/').is_some_and(|(addr, prefix)| {
        addr.parse::<std::net::Ipv4Addr>().is_ok() && prefix.parse::<u8>().is_ok_and(|p| p <= 30)
    })
}

fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && u8::from_str_radix(p, 16).is_ok())
}

/// Validates a VirtualMachine (metadata excluded).
pub fn validate_vm(vm: &VirtualMachine) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if vm.spec.running.is_some() && vm.spec.run_strategy.is_some() {
        errs.push(FieldError::invalid(
            "spec.running",
            &vm.spec.running.unwrap_or_default().to_string(),
            "running and runStrategy are mutually exclusive; set only runStrategy",
        ));
    }
    match &vm.spec.template.spec {
        None => errs.push(FieldError::required("spec.template.spec", "")),
        // An instance type gives the guest its memory (admission checks the template with
        // it applied, `kinds::vm`).
        Some(spec) if vm.spec.instancetype.is_some() => errs.extend(
            validate_vmi_spec(spec, "spec.template.spec")
                .into_iter()
                .filter(|e| {
                    !(e.kind == ErrorType::Required
                        && e.field.ends_with(".resources.requests.memory"))
                }),
        ),
        Some(spec) => errs.extend(validate_vmi_spec(spec, "spec.template.spec")),
    }
    errs.extend(validate_matchers(vm));
    errs
}

/// KubeVirt's checks of a VM's instance type and preference references (its mutating
/// webhook's messages).
fn validate_matchers(vm: &VirtualMachine) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (m, field, what) in [
        (
            &vm.spec.instancetype,
            "spec.instancetype",
            "InstancetypeMatcher",
        ),
        (&vm.spec.preference, "spec.preference", "PreferenceMatcher"),
    ] {
        let Some(m) = m else { continue };
        let set = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.is_empty());
        let not_found = |f: String, message: String| FieldError {
            kind: ErrorType::NotFound,
            field: f,
            message,
        };
        if !set(&m.name) && !set(&m.infer_from_volume) {
            errs.push(not_found(
                field.into(),
                format!("Either Name or InferFromVolume should be provided within the {what}"),
            ));
        }
        if set(&m.infer_from_volume) {
            if set(&m.name) {
                errs.push(not_found(
                    format!("{field}.name"),
                    format!(
                        "Name should not be provided when InferFromVolume is used within the {what}"
                    ),
                ));
            }
            if set(&m.kind) {
                errs.push(not_found(
                    format!("{field}.kind"),
                    format!(
                        "Kind should not be provided when InferFromVolume is used within the {what}"
                    ),
                ));
            }
        }
        let kinds: &[&str] = if field == "spec.instancetype" {
            &[
                "VirtualMachineInstancetype",
                "VirtualMachineClusterInstancetype",
            ]
        } else {
            &[
                "VirtualMachinePreference",
                "VirtualMachineClusterPreference",
            ]
        };
        if let Some(k) = m.kind.as_deref().filter(|k| !k.is_empty())
            && !kinds
                .iter()
                .any(|ok| ok.eq_ignore_ascii_case(k) || format!("{}s", ok.to_lowercase()) == k)
        {
            errs.push(FieldError::not_supported(format!("{field}.kind"), k, kinds));
        }
    }
    errs
}

/// Validates a VirtualMachineInstance (metadata excluded).
pub fn validate_vmi(vmi: &VirtualMachineInstance) -> Vec<FieldError> {
    validate_vmi_spec(&vmi.spec, "spec")
}

/// Validates a VirtualMachineInstanceMigration (metadata excluded).
pub fn validate_migration(m: &VirtualMachineInstanceMigration) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if m.spec.vmi_name.is_empty() {
        errs.push(FieldError::required("spec.vmiName", ""));
    } else {
        for e in dns1123_subdomain_errors(&m.spec.vmi_name) {
            errs.push(FieldError::invalid("spec.vmiName", &m.spec.vmi_name, &e));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmi::{Disk, Volume};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn spec_with_memory(mem: &str) -> VirtualMachineInstanceSpec {
        let mut s = VirtualMachineInstanceSpec::default();
        s.domain.memory = Some(crate::vmi::Memory {
            guest: Some(Quantity(mem.into())),
            ..Default::default()
        });
        s
    }

    #[test]
    fn valid_minimal_spec_has_no_errors() {
        assert!(validate_vmi_spec(&spec_with_memory("64Mi"), "spec").is_empty());
    }

    #[test]
    fn bad_memory_quantity_names_the_field() {
        let errs = validate_vmi_spec(&spec_with_memory("lots"), "spec");
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.domain.memory.guest");
        assert_eq!(errs[0].kind, ErrorType::Invalid);
    }

    #[test]
    fn missing_memory_is_required() {
        let errs = validate_vmi_spec(&VirtualMachineInstanceSpec::default(), "spec");
        assert_eq!(errs[0].kind, ErrorType::Required);
        assert_eq!(errs[0].field, "spec.domain.resources.requests.memory");
    }

    #[test]
    fn access_credentials_follow_kubevirts_rules() {
        let mut s = spec_with_memory("64Mi");
        s.access_credentials = Some(
            serde_json::from_value(serde_json::json!([
                {"sshPublicKey": {"source": {"secret": {"secretName": "k"}},
                                  "propagationMethod": {"qemuGuestAgent": {"users": ["root"]}}}},
                {"userPassword": {"source": {"secret": {"secretName": "p"}},
                                  "propagationMethod": {"qemuGuestAgent": {}}}}
            ]))
            .unwrap(),
        );
        assert!(validate_vmi_spec(&s, "spec").is_empty());
        s.access_credentials = Some(
            serde_json::from_value(serde_json::json!([
                {"sshPublicKey": {"source": {}, "propagationMethod": {"noCloud": {}}}},
                {"sshPublicKey": {"source": {"secret": {"secretName": "k"}},
                                  "propagationMethod": {"qemuGuestAgent": {"users": []}}}},
                {}
            ]))
            .unwrap(),
        );
        let fields: Vec<String> = validate_vmi_spec(&s, "spec")
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        assert_eq!(fields.len(), 4, "{fields:#?}");
        assert!(
            fields[0].starts_with("spec.accessCredentials[0].sshPublicKey.source"),
            "{fields:#?}"
        );
        assert!(
            fields[1].contains("requires a noCloud volume"),
            "{fields:#?}"
        );
        assert!(fields[2].contains("qemuGuestAgent.users"), "{fields:#?}");
        assert!(
            fields[3].contains("exactly one of sshPublicKey or userPassword"),
            "{fields:#?}"
        );
    }

    #[test]
    fn a_probe_has_one_handler() {
        let mut s = spec_with_memory("64Mi");
        s.readiness_probe =
            Some(serde_json::from_value(serde_json::json!({"guestAgentPing": {}})).unwrap());
        s.liveness_probe = Some(
            serde_json::from_value(serde_json::json!({"exec": {"command": ["true"]}})).unwrap(),
        );
        assert!(validate_vmi_spec(&s, "spec").is_empty());
        s.liveness_probe =
            Some(serde_json::from_value(serde_json::json!({"periodSeconds": 3})).unwrap());
        let errs = validate_vmi_spec(&s, "spec");
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.livenessProbe");
    }

    #[test]
    fn disk_without_volume_is_not_found() {
        let mut s = spec_with_memory("64Mi");
        s.domain.devices.disks = Some(vec![Disk {
            name: "root".into(),
            ..Default::default()
        }]);
        let errs = validate_vmi_spec(&s, "spec");
        assert_eq!(
            errs,
            vec![FieldError::not_found(
                "spec.domain.devices.disks[0].name",
                "root"
            )]
        );
    }

    #[test]
    fn volume_needs_exactly_one_source() {
        let mut s = spec_with_memory("64Mi");
        s.volumes = Some(vec![Volume {
            name: "v".into(),
            ..Default::default()
        }]);
        let errs = validate_vmi_spec(&s, "spec");
        assert_eq!(errs[0].field, "spec.volumes[0]");
        assert_eq!(errs[0].kind, ErrorType::Required);
    }

    fn spec_with_volume(v: Volume) -> VirtualMachineInstanceSpec {
        let mut s = spec_with_memory("64Mi");
        s.volumes = Some(vec![v]);
        s
    }

    fn host_disk(path: &str, type_: &str, capacity: Option<&str>) -> Volume {
        Volume {
            name: "h".into(),
            host_disk: Some(crate::vmi::HostDisk {
                path: path.into(),
                type_: type_.into(),
                capacity: capacity.map(|c| Quantity(c.into())),
                shared: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn volume_disk_network_and_interface_names_are_dns1123_labels() {
        let mut s = spec_with_volume(Volume {
            name: "../x".into(),
            empty_disk: Some(crate::vmi::EmptyDiskSource {
                capacity: Quantity("1Mi".into()),
            }),
            ..Default::default()
        });
        s.domain.devices.disks = Some(vec![Disk {
            name: "../x".into(),
            ..Default::default()
        }]);
        s.networks = Some(vec![crate::vmi::Network {
            name: "Pod_Net".into(),
            pod: Some(Default::default()),
            ..Default::default()
        }]);
        s.domain.devices.interfaces = Some(vec![crate::vmi::Interface {
            name: "Pod_Net".into(),
            masquerade: Some(Default::default()),
            ..Default::default()
        }]);
        let fields: Vec<(String, ErrorType)> = validate_vmi_spec(&s, "spec")
            .into_iter()
            .map(|e| (e.field, e.kind))
            .collect();
        assert_eq!(
            fields,
            vec![
                ("spec.volumes[0].name".to_string(), ErrorType::Invalid),
                (
                    "spec.domain.devices.disks[0].name".to_string(),
                    ErrorType::Invalid
                ),
                ("spec.networks[0].name".to_string(), ErrorType::Invalid),
                (
                    "spec.domain.devices.interfaces[0].name".to_string(),
                    ErrorType::Invalid
                ),
            ]
        );
        let long = spec_with_volume(Volume {
            name: "a".repeat(64),
            empty_disk: Some(crate::vmi::EmptyDiskSource {
                capacity: Quantity("1Mi".into()),
            }),
            ..Default::default()
        });
        assert_eq!(validate_vmi_spec(&long, "spec").len(), 1);
    }

    #[test]
    fn pod_network_rules_name_the_field() {
        use crate::vmi::{Interface, InterfaceBinding, MultusNetwork, Network, PodNetwork, Port};
        let pod = |name: &str, cidr: Option<&str>| Network {
            name: name.into(),
            pod: Some(PodNetwork {
                vm_network_cidr: cidr.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        let iface = |name: &str| Interface {
            name: name.into(),
            masquerade: Some(InterfaceBinding {}),
            ..Default::default()
        };
        let fields = |s: &VirtualMachineInstanceSpec| -> Vec<(String, ErrorType)> {
            validate_vmi_spec(s, "spec")
                .into_iter()
                .filter(|e| !e.field.starts_with("spec.domain.resources"))
                .map(|e| (e.field, e.kind))
                .collect()
        };
        let mut s = VirtualMachineInstanceSpec {
            networks: Some(vec![pod("default", None)]),
            ..Default::default()
        };
        s.domain.devices.interfaces = Some(vec![Interface {
            ports: Some(vec![Port {
                port: 80,
                protocol: Some("tcp".into()),
                name: None,
            }]),
            ..iface("default")
        }]);
        assert_eq!(fields(&s), vec![], "the usual VM is fine");

        // Two pod networks, a Multus one, a bad CIDR; two interfaces on the pod network, one
        // without a binding, one with SR-IOV, ports on bridge, a port out of range.
        let mut s = VirtualMachineInstanceSpec {
            networks: Some(vec![
                pod("default", Some("10.0.2.0/31")),
                pod("second", None),
                Network {
                    name: "blue".into(),
                    multus: Some(MultusNetwork {
                        network_name: "blue".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        s.domain.devices.interfaces = Some(vec![
            Interface {
                name: "default".into(),
                ..Default::default()
            },
            Interface {
                masquerade: None,
                sriov: Some(InterfaceBinding {}),
                ..iface("second")
            },
            Interface {
                masquerade: None,
                bridge: Some(InterfaceBinding {}),
                ports: Some(vec![Port {
                    port: 0,
                    protocol: Some("SCTP".into()),
                    name: None,
                }]),
                ..iface("blue")
            },
        ]);
        let d = "spec.domain.devices.interfaces";
        assert_eq!(
            fields(&s),
            vec![
                (
                    "spec.networks[0].pod.vmNetworkCIDR".into(),
                    ErrorType::Invalid
                ),
                ("spec.networks[1].pod".into(), ErrorType::Forbidden),
                ("spec.networks[2].multus".into(), ErrorType::Forbidden),
                (format!("{d}[0]"), ErrorType::Required),
                (format!("{d}[1].name"), ErrorType::Forbidden),
                (format!("{d}[1].sriov"), ErrorType::Forbidden),
                (format!("{d}[2].ports"), ErrorType::Forbidden),
                (format!("{d}[2].ports[0].port"), ErrorType::Invalid),
                (format!("{d}[2].ports[0].protocol"), ErrorType::NotSupported),
            ]
        );
    }

    #[test]
    fn host_disk_type_path_and_capacity_rules() {
        let ok = |v| validate_vmi_spec(&spec_with_volume(v), "spec");
        assert!(ok(host_disk("/var/lib/vm/a.img", "Disk", None)).is_empty());
        assert!(ok(host_disk("/var/lib/vm/a.img", "DiskOrCreate", Some("1Gi"))).is_empty());
        let one = |v, field: &str, kind| {
            let errs = ok(v);
            assert_eq!(errs.len(), 1, "{errs:?}");
            assert_eq!((errs[0].field.as_str(), errs[0].kind), (field, kind));
        };
        let path = "spec.volumes[0].hostDisk.path";
        one(host_disk("", "Disk", None), path, ErrorType::Required);
        one(host_disk("a.img", "Disk", None), path, ErrorType::Invalid);
        one(
            host_disk("/var/../dev/sda", "Disk", None),
            path,
            ErrorType::Invalid,
        );
        let cap = "spec.volumes[0].hostDisk.capacity";
        one(
            host_disk("/a", "DiskOrCreate", None),
            cap,
            ErrorType::Required,
        );
        one(
            host_disk("/a", "DiskOrCreate", Some("0")),
            cap,
            ErrorType::Invalid,
        );
        one(
            host_disk("/a", "Disk", Some("1Gi")),
            cap,
            ErrorType::Forbidden,
        );
        let ty = "spec.volumes[0].hostDisk.type";
        one(host_disk("/a", "", None), ty, ErrorType::Required);
        one(host_disk("/a", "Block", None), ty, ErrorType::NotSupported);
    }

    #[test]
    fn names_must_be_dns1123() {
        let meta = ObjectMeta {
            name: Some("Bad_Name".into()),
            ..Default::default()
        };
        let errs = validate_object_meta(&meta, "metadata");
        assert_eq!(errs[0].field, "metadata.name");
        let long = ObjectMeta {
            name: Some("a".repeat(254)),
            ..Default::default()
        };
        assert!(!validate_object_meta(&long, "metadata").is_empty());
        let missing = ObjectMeta::default();
        assert_eq!(
            validate_object_meta(&missing, "metadata")[0].kind,
            ErrorType::Required
        );
    }
}
