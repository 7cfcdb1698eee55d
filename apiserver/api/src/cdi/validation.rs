//! DataVolume validation: CDI's `datavolume-validate` webhook rules, plus a refusal naming
//! the field for each part kubevirt-rs does not carry out (rather than a DataVolume that
//! never leaves Pending). The same rules check a VM's `dataVolumeTemplates[i].spec`
//! ([`validate_spec`] with that path).

use k8s_openapi::api::core::v1::VolumeResourceRequirements;

use super::DATA_SOURCE_KIND;
use super::datavolume::{ContentType, DataVolume, DataVolumeSpec, RegistryPullMethod};
use crate::quantity;
use crate::validation::FieldError;

/// Source types kubevirt-rs populates.
pub const SUPPORTED_SOURCES: [&str; 5] = ["http", "registry", "pvc", "upload", "blank"];

/// Access modes Kubernetes knows.
const ACCESS_MODES: [&str; 4] = [
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

/// Registry URL schemes CDI accepts.
const REGISTRY_SCHEMES: [&str; 2] = ["docker://", "oci-archive://"];

/// Digest algorithms of `http.checksum` and the length of their hex digest.
const CHECKSUMS: [(&str, usize); 4] = [("md5", 32), ("sha1", 40), ("sha256", 64), ("sha512", 128)];

/// Validates a DataVolume (metadata is validated generically).
pub fn validate_data_volume(dv: &DataVolume) -> Vec<FieldError> {
    validate_spec(&dv.spec, "spec")
}

/// Every error of a DataVolume spec at `path` (`spec`, or a VM's
/// `spec.dataVolumeTemplates[0].spec`).
pub fn validate_spec(spec: &DataVolumeSpec, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    errs.extend(target_errors(spec, path));
    errs.extend(source_errors(spec, path));
    if spec.content_type == Some(ContentType::Archive) {
        errs.push(FieldError::forbidden(
            format!("{path}.contentType"),
            "contentType archive is not supported by kubevirt-rs yet: only disk images \
             (contentType kubevirt) are imported",
        ));
    }
    errs
}

/// Exactly one of `pvc` / `storage`, with valid access modes, volume mode and size.
fn target_errors(spec: &DataVolumeSpec, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    // A size is needed unless the data's own size decides it (a clone, a DataSource).
    let size_required = spec
        .source
        .as_ref()
        .is_some_and(|s| s.pvc.is_none() && s.snapshot.is_none());
    match (&spec.pvc, &spec.storage) {
        (None, None) => errs.push(FieldError::required(
            format!("{path}.storage"),
            &format!("one of {path}.pvc or {path}.storage is required: the claim to create"),
        )),
        (Some(_), Some(_)) => errs.push(FieldError::invalid(
            format!("{path}.pvc"),
            "pvc and storage",
            "Duplicate storage definition, both target storage and target pvc defined: set one",
        )),
        (Some(pvc), None) => {
            let p = format!("{path}.pvc");
            match pvc.access_modes.as_deref() {
                None | Some([]) => errs.push(FieldError::required(
                    format!("{p}.accessModes"),
                    "at least 1 access mode is required",
                )),
                Some(modes) => errs.extend(access_mode_errors(modes, &p)),
            }
            if let Some(mode) = &pvc.volume_mode
                && !["Filesystem", "Block"].contains(&mode.as_str())
            {
                errs.push(FieldError::not_supported(
                    format!("{p}.volumeMode"),
                    mode,
                    &["Block", "Filesystem"],
                ));
            }
            errs.extend(size_errors(pvc.resources.as_ref(), &p, size_required));
        }
        (None, Some(storage)) => {
            let p = format!("{path}.storage");
            if let Some(modes) = &storage.access_modes {
                errs.extend(access_mode_errors(modes, &p));
            }
            if let Some(mode) = &storage.volume_mode
                && !["Filesystem", "Block", "FromStorageProfile"].contains(&mode.as_str())
            {
                errs.push(FieldError::not_supported(
                    format!("{p}.volumeMode"),
                    mode,
                    &["Block", "Filesystem", "FromStorageProfile"],
                ));
            }
            errs.extend(size_errors(storage.resources.as_ref(), &p, size_required));
        }
    }
    errs
}

fn access_mode_errors(modes: &[String], path: &str) -> Vec<FieldError> {
    modes
        .iter()
        .enumerate()
        .filter(|(_, m)| !ACCESS_MODES.contains(&m.as_str()))
        .map(|(i, m)| {
            FieldError::not_supported(format!("{path}.accessModes[{i}]"), m, &ACCESS_MODES)
        })
        .collect()
}

/// `resources.requests.storage` under `path`: required when `required`, positive when set.
fn size_errors(
    resources: Option<&VolumeResourceRequirements>,
    path: &str,
    required: bool,
) -> Vec<FieldError> {
    let field = format!("{path}.resources.requests.storage");
    let size = resources
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"));
    match size {
        None if required => vec![FieldError::required(
            field,
            "the size of the disk to create (e.g. 10Gi): blank, http, registry and upload \
             sources need one",
        )],
        None => Vec::new(),
        Some(q) => match quantity::parse(&q.0) {
            Ok(v) if v <= 0.0 => vec![FieldError::invalid(
                field,
                &q.0,
                "PVC size can't be equal or less than zero",
            )],
            Ok(_) => Vec::new(),
            Err(e) => vec![FieldError::invalid(field, &q.0, &e.to_string())],
        },
    }
}

/// Exactly one of `source` / `sourceRef`; exactly one supported source type, valid.
fn source_errors(spec: &DataVolumeSpec, path: &str) -> Vec<FieldError> {
    let external = [
        spec.pvc
            .as_ref()
            .map(|p| (p.data_source.is_some(), p.data_source_ref.is_some(), "pvc")),
        spec.storage.as_ref().map(|s| {
            (
                s.data_source.is_some(),
                s.data_source_ref.is_some(),
                "storage",
            )
        }),
    ]
    .into_iter()
    .flatten()
    .find_map(|(ds, dsr, target)| match (ds, dsr) {
        (_, true) => Some(format!("{path}.{target}.dataSourceRef")),
        (true, false) => Some(format!("{path}.{target}.dataSource")),
        _ => None,
    });
    match (&spec.source, &spec.source_ref) {
        (Some(_), Some(_)) => {
            return vec![FieldError::invalid(
                format!("{path}.sourceRef"),
                "source and sourceRef",
                "source and sourceRef are mutually exclusive: set one",
            )];
        }
        (None, None) => {
            return vec![match external {
                // KubeVirt and CDI let a volume populator fill such a claim; kubevirt-rs
                // runs no populators, so the claim would stay empty.
                Some(field) => FieldError::forbidden(
                    field,
                    "external population (a claim filled by a volume populator) is not \
                     supported by kubevirt-rs: set spec.source or spec.sourceRef",
                ),
                None => FieldError::required(
                    format!("{path}.source"),
                    &format!(
                        "Missing Data volume source: set {path}.source (one of {}) or {path}.sourceRef",
                        SUPPORTED_SOURCES.join(", ")
                    ),
                ),
            }];
        }
        _ => {}
    }
    let mut errs = Vec::new();
    if let Some(field) = external {
        errs.push(FieldError::invalid(
            field,
            "",
            "External population is incompatible with Source and SourceRef",
        ));
    }
    if let Some(r) = &spec.source_ref {
        let p = format!("{path}.sourceRef");
        if r.kind != DATA_SOURCE_KIND {
            errs.push(FieldError::not_supported(
                format!("{p}.kind"),
                &r.kind,
                &[DATA_SOURCE_KIND],
            ));
        }
        if r.name.is_empty() {
            errs.push(FieldError::required(format!("{p}.name"), ""));
        }
    }
    let Some(source) = &spec.source else {
        return errs;
    };
    let p = format!("{path}.source");
    let set = source.types_set();
    match set.as_slice() {
        [] => {
            errs.push(FieldError::required(
                &p,
                &format!(
                    "Missing Data volume source: set one of {}",
                    SUPPORTED_SOURCES.join(", ")
                ),
            ));
            return errs;
        }
        [_] => {}
        many => {
            errs.push(FieldError::invalid(
                &p,
                &many.join(", "),
                "Multiple Data volume sources: set exactly one",
            ));
            return errs;
        }
    }
    for t in set {
        if !SUPPORTED_SOURCES.contains(&t) {
            errs.push(FieldError::forbidden(
                format!("{p}.{t}"),
                &format!(
                    "the {t} source is not supported by kubevirt-rs; supported sources: {}",
                    SUPPORTED_SOURCES.join(", ")
                ),
            ));
        }
    }
    if let Some(http) = &source.http {
        let hp = format!("{p}.http");
        if let Err(why) = check_http_url(&http.url) {
            errs.push(if http.url.is_empty() {
                FieldError::required(format!("{hp}.url"), "source URL is empty")
            } else {
                FieldError::invalid(format!("{hp}.url"), &http.url, &why)
            });
        }
        if let Some(sum) = &http.checksum
            && let Err(why) = check_checksum(sum)
        {
            errs.push(FieldError::invalid(format!("{hp}.checksum"), sum, &why));
        }
        for (i, h) in http.extra_headers.iter().flatten().enumerate() {
            if !is_header(h) {
                errs.push(FieldError::invalid(
                    format!("{hp}.extraHeaders[{i}]"),
                    h,
                    "an HTTP header is written `Name: value`",
                ));
            }
        }
    }
    if let Some(reg) = &source.registry {
        let rp = format!("{p}.registry");
        let url = reg.url.as_deref().filter(|u| !u.is_empty());
        let stream = reg.image_stream.as_deref().filter(|s| !s.is_empty());
        match (url, stream) {
            (Some(_), Some(_)) => errs.push(FieldError::invalid(
                format!("{rp}.imageStream"),
                stream.unwrap_or_default(),
                "url and imageStream are mutually exclusive: set one",
            )),
            (None, None) => errs.push(FieldError::required(
                format!("{rp}.url"),
                "the image, e.g. docker://quay.io/containerdisks/fedora:latest",
            )),
            (Some(u), None) => {
                if !REGISTRY_SCHEMES.iter().any(|s| u.starts_with(s))
                    || REGISTRY_SCHEMES.contains(&u)
                {
                    errs.push(FieldError::invalid(
                        format!("{rp}.url"),
                        u,
                        "illegal registry source URL scheme: the URL must start with docker:// \
                         or oci-archive://",
                    ));
                }
            }
            (None, Some(_)) => {
                if reg.pull_method != Some(RegistryPullMethod::Node) {
                    errs.push(FieldError::invalid(
                        format!("{rp}.pullMethod"),
                        "",
                        "ImageStream requires pullMethod node",
                    ));
                }
            }
        }
    }
    if let Some(pvc) = &source.pvc
        && pvc.name.is_empty()
    {
        errs.push(FieldError::required(
            format!("{p}.pvc.name"),
            "the claim to clone",
        ));
    }
    errs
}

/// CDI's rule: a request URI with scheme http or https (and, here, a host).
fn check_http_url(url: &str) -> Result<(), String> {
    if url.is_empty() {
        return Err("source URL is empty".into());
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "Invalid source URL: {url}: expected http://HOST/PATH or https://HOST/PATH"
        ));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(format!(
            "Invalid source URL scheme: {url}: only http and https are supported"
        ));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    if host.is_empty() || host.starts_with(':') {
        return Err(format!("Invalid source URL: {url}: no host"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("Invalid source URL: {url}: contains white space"));
    }
    Ok(())
}

/// `algorithm:hex` with a known algorithm and a digest of its length.
fn check_checksum(sum: &str) -> Result<(), String> {
    let names: Vec<&str> = CHECKSUMS.iter().map(|(n, _)| *n).collect();
    let Some((algo, hex)) = sum.split_once(':') else {
        return Err(format!(
            "expected ALGORITHM:HEX with ALGORITHM one of {}",
            names.join(", ")
        ));
    };
    let Some((_, len)) = CHECKSUMS.iter().find(|(n, _)| *n == algo) else {
        return Err(format!(
            "unknown algorithm {algo:?}: one of {}",
            names.join(", ")
        ));
    };
    if hex.len() != *len || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("a {algo} digest is {len} hexadecimal digits"));
    }
    Ok(())
}

/// `Name: value` with an RFC 7230 token as the name.
fn is_header(h: &str) -> bool {
    let Some((name, _)) = h.split_once(':') else {
        return false;
    };
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
}

/// CDI's defaulting: an unset content type is a disk image.
pub fn default_data_volume(dv: &mut DataVolume) {
    if dv.spec.content_type.is_none() {
        dv.spec.content_type = Some(ContentType::Kubevirt);
    }
}

#[cfg(test)]
#[path = "validation_tests.rs"]
mod tests;
