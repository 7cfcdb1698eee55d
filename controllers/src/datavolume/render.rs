//! The objects a DataVolume is carried out with (pure): its claim ([`claim`]) and the
//! worker pod that fills it — the importer ([`importer_pod`]) or, for a `pvc` source, the
//! clone worker ([`clone_pod`]) — with CDI's names, labels and annotations so that CDI's
//! clients (`virtctl image-upload`, users' scripts) read them unchanged.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, HTTPGetAction,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, Probe, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kubevirt_api::cdi::annotations as ann;
use kubevirt_api::cdi::{DataVolume, DataVolumeSourceHttp, DataVolumeSourcePvc};
use kubevirt_api::{LAUNCHER_UID, quantity};

use crate::vmi::claims;

/// Where the importer finds the claim (Filesystem mode: it writes `disk.img` here).
pub const DATA_DIR: &str = "/data";
/// Where the clone worker finds the claim it copies (read-only).
pub const SOURCE_DIR: &str = "/source";
/// The importer binary in the virt-launcher image (next to qemu-img).
pub const IMPORTER_BINARY: &str = "/usr/bin/virt-importer";
/// The importer's container name (CDI's).
pub const IMPORTER_CONTAINER: &str = "importer";
/// The clone worker's container name.
pub const CLONE_CONTAINER: &str = "clone";
/// Where kubelet reads the termination message from (its default path).
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// Label CDI puts on its worker pods, saying which kind of worker.
pub const WORKER_LABEL: &str = "cdi.kubevirt.io";
/// Value of [`WORKER_LABEL`] on importer pods.
pub const WORKER_IMPORTER: &str = "importer";
/// Value of [`WORKER_LABEL`] on clone worker pods.
pub const WORKER_CLONE: &str = "cdi-clone";
/// The upload server's container name (CDI's).
pub const UPLOAD_CONTAINER: &str = "cdi-upload-server";
/// Value of [`WORKER_LABEL`] on upload server pods (CDI's).
pub const WORKER_UPLOAD: &str = "cdi-upload-server";
/// Name of the upload server's container port; the upload proxy sends to it.
pub const UPLOAD_PORT_NAME: &str = "upload";
/// The port the upload server listens on (plain HTTP inside the pod network).
pub const UPLOAD_PORT: i32 = 8080;
/// Its readiness path: ready means it accepts an upload (`UploadReady`).
pub const UPLOAD_HEALTHZ: &str = "/healthz";
/// [`ann::CLONE_TYPE`] of a clone a worker pod copies (CDI's host-assisted clone).
pub const CLONE_TYPE_COPY: &str = "copy";
/// Where a source's Secret (basic-auth credentials) is mounted.
const SECRET_DIR: &str = "/var/run/importer/secret";
/// Where a source's ConfigMap of CA certificates is mounted.
const CERT_DIR: &str = "/var/run/importer/certs";
/// Longest object name that is also a valid label value and DNS label (CDI's bound).
const MAX_NAME: usize = 63;

/// Why a DataVolume's claim or pod cannot be rendered; each is a fault of the DataVolume
/// that holds until its spec changes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RenderError {
    /// Not read from the API (no namespace or uid).
    #[error("DataVolume {0} has no namespace or uid")]
    NotPersisted(String),
    /// Neither `spec.pvc` nor `spec.storage`.
    #[error("DataVolume {0} has neither spec.pvc nor spec.storage")]
    NoClaimSpec(String),
    /// No `resources.requests.storage`, and no source claim to take it from.
    #[error("DataVolume {0}: the claim requests no storage size (resources.requests.storage)")]
    NoSize(String),
    /// The size does not parse.
    #[error("DataVolume {name}: invalid storage size {value:?}")]
    BadSize {
        /// DataVolume name.
        name: String,
        /// The quantity as written.
        value: String,
    },
    /// The claim is too small to hold a `disk.img`.
    #[error("claim {0} is too small for a disk image")]
    TooSmall(String),
}

/// The controller reference every object of a DataVolume carries: the garbage collector
/// deletes the claim and pod with the DataVolume.
pub fn owner(dv: &DataVolume) -> Result<OwnerReference, RenderError> {
    Ok(OwnerReference {
        api_version: kubevirt_api::cdi::API_VERSION.into(),
        kind: "DataVolume".into(),
        name: dv.name_any(),
        uid: dv
            .metadata
            .uid
            .clone()
            .ok_or_else(|| RenderError::NotPersisted(dv.name_any()))?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// Whether `owner` is the controller reference of `obj`.
pub fn controlled_by(refs: Option<&[OwnerReference]>, dv: &DataVolume) -> bool {
    refs.unwrap_or_default().iter().any(|r| {
        r.controller == Some(true)
            && r.kind == "DataVolume"
            && Some(&r.uid) == dv.metadata.uid.as_ref()
    })
}

/// The StorageClass a claim without one gets: KubeVirt's virtualization default
/// (`storageclass.kubevirt.io/is-default-virt-class`) before the cluster's default; among
/// several marked defaults, the newest, as kube-apiserver's DefaultStorageClass admission
/// picks. None: the claim goes without a class and Kubernetes decides.
pub fn default_class(classes: &[StorageClass]) -> Option<&StorageClass> {
    let marked = |key: &str| {
        classes
            .iter()
            .filter(|c| c.annotations().get(key).map(String::as_str) == Some("true"))
            .max_by(|a, b| {
                (
                    a.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    b.name_any(),
                )
                    .cmp(&(
                        b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                        a.name_any(),
                    ))
            })
    };
    marked(ann::DEFAULT_VIRT_STORAGE_CLASS).or_else(|| marked(ann::DEFAULT_STORAGE_CLASS))
}

/// `Filesystem` or `Block`, as the claim will be made (`FromStorageProfile` and unset are
/// Filesystem: kubevirt-rs has no StorageProfiles yet).
pub fn volume_mode(dv: &DataVolume) -> &'static str {
    let mode = match (&dv.spec.pvc, &dv.spec.storage) {
        (Some(p), _) => p.volume_mode.as_deref(),
        (None, Some(s)) => s.volume_mode.as_deref(),
        (None, None) => None,
    };
    if mode == Some("Block") {
        "Block"
    } else {
        "Filesystem"
    }
}

fn size_of(
    dv: &DataVolume,
    requests: Option<&BTreeMap<String, Quantity>>,
) -> Result<u64, RenderError> {
    let q = requests
        .and_then(|r| r.get("storage"))
        .ok_or_else(|| RenderError::NoSize(dv.name_any()))?;
    quantity::parse_bytes(&q.0).map_err(|_| RenderError::BadSize {
        name: dv.name_any(),
        value: q.0.clone(),
    })
}

/// The size of a claim, `storage` of its status' capacity (what it got) or else of its
/// request (what it asked for), as written.
pub fn claim_size(pvc: &PersistentVolumeClaim) -> Option<&Quantity> {
    let capacity = pvc
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"));
    capacity.or_else(|| {
        pvc.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
    })
}

/// The storage request of a claim, in bytes.
pub fn requested_bytes(pvc: &PersistentVolumeClaim) -> Option<u64> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| quantity::parse_bytes(&q.0).ok())
}

/// The claim a `pvc` source names (namespace defaulted to the DataVolume's), if `dv` clones.
pub fn clone_source(dv: &DataVolume) -> Option<(String, &DataVolumeSourcePvc)> {
    let pvc = dv.spec.source.as_ref()?.pvc.as_ref()?;
    let ns = pvc
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| dv.namespace())?;
    Some((ns, pvc))
}

/// The claim of `dv`: named as the DataVolume, in its namespace, controlled by it, with
/// CDI's label and annotations. `spec.pvc` is taken as written; `spec.storage` is completed
/// as CDI does without StorageProfiles: the class as given or the default ([`default_class`]),
/// `[ReadWriteOnce]`, Filesystem, and a Filesystem request grown by the filesystem overhead
/// ([`claims::request_for_disk`]) so that `disk.img` gets the size asked for.
///
/// A clone that asks for no size gets its source's (`source_claim`, the claim it copies): what
/// the source got, not grown again (its `disk.img` already fits), as CDI sizes a clone.
pub fn claim(
    dv: &DataVolume,
    classes: &[StorageClass],
    source_claim: Option<&PersistentVolumeClaim>,
) -> Result<PersistentVolumeClaim, RenderError> {
    let name = dv.name_any();
    let ns = dv
        .namespace()
        .ok_or_else(|| RenderError::NotPersisted(name.clone()))?;
    let inherited = || {
        clone_source(dv)
            .and(source_claim)
            .and_then(claim_size)
            .cloned()
            .ok_or_else(|| RenderError::NoSize(name.clone()))
    };
    let spec = match (&dv.spec.pvc, &dv.spec.storage) {
        (Some(pvc), _) => {
            let mut pvc = pvc.clone();
            let requests = pvc.resources.as_ref().and_then(|r| r.requests.as_ref());
            if requests.is_some_and(|r| r.contains_key("storage")) {
                size_of(dv, requests)?;
            } else {
                let size = inherited()?;
                pvc.resources
                    .get_or_insert_with(VolumeResourceRequirements::default)
                    .requests
                    .get_or_insert_with(BTreeMap::new)
                    .insert("storage".into(), size);
            }
            pvc
        }
        (None, Some(s)) => {
            let mut requests = s
                .resources
                .as_ref()
                .and_then(|r| r.requests.clone())
                .unwrap_or_default();
            let mode = volume_mode(dv);
            if requests.contains_key("storage") || clone_source(dv).is_none() {
                let bytes = size_of(dv, Some(&requests))?;
                if mode == "Filesystem" {
                    let grown = claims::request_for_disk(bytes);
                    requests.insert("storage".into(), Quantity(format!("{}Mi", grown >> 20)));
                }
            } else {
                requests.insert("storage".into(), inherited()?);
            }
            PersistentVolumeClaimSpec {
                access_modes: Some(
                    s.access_modes
                        .clone()
                        .filter(|m| !m.is_empty())
                        .unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
                ),
                selector: s.selector.clone(),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(requests),
                    limits: s.resources.as_ref().and_then(|r| r.limits.clone()),
                }),
                volume_name: s.volume_name.clone(),
                storage_class_name: s
                    .storage_class_name
                    .clone()
                    .or_else(|| default_class(classes).map(|c| c.name_any())),
                volume_mode: Some(mode.into()),
                data_source: s.data_source.clone(),
                data_source_ref: s.data_source_ref.clone(),
                ..PersistentVolumeClaimSpec::default()
            }
        }
        (None, None) => return Err(RenderError::NoClaimSpec(name)),
    };

    let mut annotations = BTreeMap::new();
    let source = dv.spec.source.as_ref();
    if let Some(http) = source.and_then(|s| s.http.as_ref()) {
        annotations.insert(
            ann::IMPORT_SOURCE.to_string(),
            ann::source::HTTP.to_string(),
        );
        annotations.insert(ann::IMPORT_ENDPOINT.into(), http.url.clone());
        annotations.insert(ann::IMPORT_POD.into(), importer_pod_name(&name));
        if let Some(s) = &http.secret_ref {
            annotations.insert(ann::IMPORT_SECRET.into(), s.clone());
        }
        if let Some(c) = &http.cert_config_map {
            annotations.insert(ann::IMPORT_CERT_CONFIG_MAP.into(), c.clone());
        }
        if let Some(h) = http.extra_headers.as_ref().filter(|h| !h.is_empty()) {
            // CDI's encoding: a JSON list of "Name: value".
            if let Ok(json) = serde_json::to_string(h) {
                annotations.insert(ann::IMPORT_EXTRA_HEADERS.into(), json);
            }
        }
        if let Some(c) = &http.checksum {
            annotations.insert(ann::IMPORT_CHECKSUM.into(), c.clone());
        }
    } else if source.is_some_and(|s| s.upload.is_some()) {
        // CDI's mark of a claim filled by an upload (virtctl's `pvc` mode sets it itself),
        // and where its server is: the upload proxy reads both.
        annotations.insert(ann::UPLOAD_TARGET.into(), String::new());
        annotations.insert(ann::UPLOAD_POD.into(), upload_pod_name(&name));
    } else if source.is_some_and(|s| s.blank.is_some()) {
        annotations.insert(ann::IMPORT_SOURCE.into(), ann::source::NONE.into());
    } else if let Some((src_ns, pvc)) = clone_source(dv) {
        annotations.insert(ann::CLONE_REQUEST.into(), format!("{src_ns}/{}", pvc.name));
        annotations.insert(ann::CLONE_TYPE.into(), CLONE_TYPE_COPY.into());
    }
    annotations.insert(
        ann::CONTENT_TYPE.into(),
        dv.spec
            .content_type
            .map_or("kubevirt", |c| c.as_str())
            .to_string(),
    );
    // Presence is what counts (CDI's ImmediateBindingRequested): copied as is.
    if let Some(v) = dv.annotations().get(ann::BIND_IMMEDIATE_REQUESTED) {
        annotations.insert(ann::BIND_IMMEDIATE_REQUESTED.into(), v.clone());
    }
    if let Some(p) = &dv.spec.priority_class_name {
        annotations.insert(ann::POD_PRIORITY_CLASS_NAME.into(), p.clone());
    }
    let mut labels = dv.labels().clone();
    labels.insert(ann::APP_LABEL.into(), ann::APP_LABEL_VALUE.into());

    Ok(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(ns),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner(dv)?]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// CDI's importer pod name, `importer-<claim>`; past 63 characters the name is cut and
/// ends in a hash of the whole, so two long names stay apart and one name always maps to
/// the same pod (the controller finds its pod by name).
pub fn importer_pod_name(claim: &str) -> String {
    bounded_name(&format!("importer-{claim}"))
}

fn bounded_name(name: &str) -> String {
    if name.len() <= MAX_NAME {
        return name.to_string();
    }
    // FNV-1a: stable across Rust releases, unlike std's hasher (names outlive builds).
    let hash = name.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let suffix = format!("-{hash:08x}");
    let mut cut = MAX_NAME - suffix.len();
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let head = name[..cut].trim_end_matches(['-', '.']);
    format!("{head}{suffix}")
}

/// Cluster-wide inputs of importer pods (virt-controller's `--launcher-image`: the
/// importer ships in the virt-launcher image next to qemu-img).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImporterConfig {
    /// The image.
    pub image: String,
    /// Its pull policy.
    pub image_pull_policy: Option<String>,
}

fn q(s: &str) -> Quantity {
    Quantity(s.into())
}

/// The importer pod of `dv`, writing `http` into `pvc`.
///
/// It is the claim's first consumer: on a WaitForFirstConsumer class (local-path) the
/// claim binds to the node the scheduler picks for the importer, and the VM's launcher
/// later follows the volume's node affinity there. (KubeVirt places the claim with a
/// temporary pod shaped like the VM's launcher, so the node also fits the VM; that is a
/// later step — here a VM that does not fit the importer's node stays unschedulable.)
///
/// The pod has no API credentials (a namespace editor can exec into it), runs as the
/// launcher's unprivileged user, and retries through kubelet (`OnFailure`): restartCount
/// is the DataVolume's, and each failed attempt leaves its typed reason in the container's
/// termination message.
pub fn importer_pod(
    dv: &DataVolume,
    http: &DataVolumeSourceHttp,
    pvc: &PersistentVolumeClaim,
    cfg: &ImporterConfig,
) -> Result<Pod, RenderError> {
    let claim_name = pvc.name_any();
    let size = claims::Claim::from_pvc(pvc)
        .disk_img_size()
        .ok_or_else(|| RenderError::TooSmall(claim_name.clone()))?;
    let mut args = vec![
        "import".to_string(),
        "--url".into(),
        http.url.clone(),
        "--target".into(),
        DATA_DIR.into(),
        "--size".into(),
        size.to_string(),
        "--termination-log".into(),
        TERMINATION_LOG.into(),
    ];
    if let Some(c) = &http.checksum {
        args.extend(["--checksum".to_string(), c.clone()]);
    }
    for h in http.extra_headers.iter().flatten() {
        args.extend(["--extra-header".to_string(), h.clone()]);
    }
    let mut volumes = vec![Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim_name.clone(),
            read_only: None,
        }),
        ..Volume::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "data".into(),
        mount_path: DATA_DIR.into(),
        ..VolumeMount::default()
    }];
    // Credentials and CA certificates reach the importer as files kubelet mounts: the
    // pod itself reads nothing from the API.
    if let Some(secret) = &http.secret_ref {
        volumes.push(Volume {
            name: "secret".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
        mounts.push(read_only("secret", SECRET_DIR));
        args.extend(["--secret-dir".to_string(), SECRET_DIR.into()]);
    }
    if let Some(cm) = &http.cert_config_map {
        volumes.push(Volume {
            name: "certs".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: cm.clone(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
        mounts.push(read_only("certs", CERT_DIR));
        args.extend(["--cert-dir".to_string(), CERT_DIR.into()]);
    }

    worker_pod(
        dv,
        Worker {
            name: importer_pod_name(&claim_name),
            kind: WORKER_IMPORTER,
            container: IMPORTER_CONTAINER,
            args,
            volumes,
            mounts,
        },
        cfg,
    )
}

/// CDI's clone worker name, `cdi-clone-<claim>` (cut with a hash as
/// [`importer_pod_name`]).
pub fn clone_pod_name(claim: &str) -> String {
    bounded_name(&format!("cdi-clone-{claim}"))
}

/// CDI's upload server name, `cdi-upload-<claim>` (cut with a hash as
/// [`importer_pod_name`]).
pub fn upload_pod_name(claim: &str) -> String {
    bounded_name(&format!("cdi-upload-{claim}"))
}

/// The worker pod name of `dv`'s claim: its clone worker for a `pvc` source, its upload
/// server for an `upload` source, else its importer.
pub fn worker_pod_name(dv: &DataVolume) -> String {
    let claim = dv.name_any();
    if clone_source(dv).is_some() {
        clone_pod_name(&claim)
    } else if dv.spec.source.as_ref().is_some_and(|s| s.upload.is_some()) {
        upload_pod_name(&claim)
    } else {
        importer_pod_name(&claim)
    }
}

/// The upload server of `dv`: `virt-importer upload-server` with the claim at [`DATA_DIR`],
/// listening on [`UPLOAD_PORT`], ready once it accepts an upload. The same unprivileged
/// shape as the importer and no credentials: the proxy checks the user's token, and the
/// server only takes bytes into its claim. The claim names the pod ([`ann::UPLOAD_POD`]),
/// so the proxy finds it.
pub fn upload_pod(
    dv: &DataVolume,
    pvc: &PersistentVolumeClaim,
    cfg: &ImporterConfig,
) -> Result<Pod, RenderError> {
    let claim_name = pvc.name_any();
    let size = claims::Claim::from_pvc(pvc)
        .disk_img_size()
        .ok_or_else(|| RenderError::TooSmall(claim_name.clone()))?;
    let args = vec![
        "upload-server".to_string(),
        "--listen".into(),
        format!("0.0.0.0:{UPLOAD_PORT}"),
        "--target".into(),
        DATA_DIR.into(),
        "--size".into(),
        size.to_string(),
        "--termination-log".into(),
        TERMINATION_LOG.into(),
    ];
    let volumes = vec![Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim_name.clone(),
            read_only: None,
        }),
        ..Volume::default()
    }];
    let mounts = vec![VolumeMount {
        name: "data".into(),
        mount_path: DATA_DIR.into(),
        ..VolumeMount::default()
    }];
    let mut pod = worker_pod(
        dv,
        Worker {
            name: upload_pod_name(&claim_name),
            kind: WORKER_UPLOAD,
            container: UPLOAD_CONTAINER,
            args,
            volumes,
            mounts,
        },
        cfg,
    )?;
    if let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.ports = Some(vec![ContainerPort {
            name: Some(UPLOAD_PORT_NAME.into()),
            container_port: UPLOAD_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]);
        c.readiness_probe = Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some(UPLOAD_HEALTHZ.into()),
                port: IntOrString::Int(UPLOAD_PORT),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(2),
            ..Probe::default()
        });
    }
    Ok(pod)
}

/// The clone worker of `dv`: one pod mounting the claim `source` (same namespace) read-only
/// and the DataVolume's claim `pvc`, copying the source's disk into it (`virt-importer
/// clone`). Claims are namespaced, so one pod can only clone within a namespace.
///
/// It is the target claim's first consumer and uses the source claim, so the scheduler
/// puts it where the source's volume is (a local volume's node) and a WaitForFirstConsumer
/// target is provisioned there too. Same unprivileged shape as the importer.
pub fn clone_pod(
    dv: &DataVolume,
    source: &DataVolumeSourcePvc,
    pvc: &PersistentVolumeClaim,
    cfg: &ImporterConfig,
) -> Result<Pod, RenderError> {
    let claim_name = pvc.name_any();
    let size = claims::Claim::from_pvc(pvc)
        .disk_img_size()
        .ok_or_else(|| RenderError::TooSmall(claim_name.clone()))?;
    let args = vec![
        "clone".to_string(),
        "--source".into(),
        SOURCE_DIR.into(),
        "--target".into(),
        DATA_DIR.into(),
        "--size".into(),
        size.to_string(),
        "--termination-log".into(),
        TERMINATION_LOG.into(),
    ];
    let volumes = vec![
        Volume {
            name: "source".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: source.name.clone(),
                // Read-only: the copy never writes the source, and another reader of it
                // (a clone of the same claim) may run at the same time.
                read_only: Some(true),
            }),
            ..Volume::default()
        },
        Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name.clone(),
                read_only: None,
            }),
            ..Volume::default()
        },
    ];
    let mounts = vec![
        read_only("source", SOURCE_DIR),
        VolumeMount {
            name: "data".into(),
            mount_path: DATA_DIR.into(),
            ..VolumeMount::default()
        },
    ];
    worker_pod(
        dv,
        Worker {
            name: clone_pod_name(&claim_name),
            kind: WORKER_CLONE,
            container: CLONE_CONTAINER,
            args,
            volumes,
            mounts,
        },
        cfg,
    )
}

/// What differs between the worker pods.
struct Worker {
    name: String,
    /// [`WORKER_LABEL`]'s value.
    kind: &'static str,
    container: &'static str,
    args: Vec<String>,
    volumes: Vec<Volume>,
    mounts: Vec<VolumeMount>,
}

/// A worker pod of `dv`: no API credentials (a namespace editor can exec into it), the
/// launcher's unprivileged user, retries through kubelet (`OnFailure`) with each failed
/// attempt's typed reason in the termination message.
fn worker_pod(dv: &DataVolume, w: Worker, cfg: &ImporterConfig) -> Result<Pod, RenderError> {
    let ns = dv
        .namespace()
        .ok_or_else(|| RenderError::NotPersisted(dv.name_any()))?;
    let Worker {
        name,
        kind,
        container,
        args,
        volumes,
        mounts,
    } = w;
    let labels = BTreeMap::from([
        (ann::APP_LABEL.to_string(), ann::APP_LABEL_VALUE.to_string()),
        (WORKER_LABEL.to_string(), kind.to_string()),
    ]);
    let uid = i64::from(LAUNCHER_UID);
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(ns),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                ann::CREATED_BY_CONTROLLER.to_string(),
                "yes".to_string(),
            )])),
            owner_references: Some(vec![owner(dv)?]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("OnFailure".into()),
            automount_service_account_token: Some(false),
            priority_class_name: dv.spec.priority_class_name.clone(),
            containers: vec![Container {
                name: container.into(),
                image: Some(cfg.image.clone()),
                image_pull_policy: cfg.image_pull_policy.clone(),
                command: Some(vec![IMPORTER_BINARY.into()]),
                args: Some(args),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_string(), q("10m")),
                        ("memory".to_string(), q("64Mi")),
                    ])),
                    limits: Some(BTreeMap::from([("memory".to_string(), q("600Mi"))])),
                    ..ResourceRequirements::default()
                }),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        ..Capabilities::default()
                    }),
                    run_as_non_root: Some(true),
                    ..SecurityContext::default()
                }),
                termination_message_path: Some(TERMINATION_LOG.into()),
                // The importer always writes its JSON result; a crash before that leaves
                // the log's tail, which still says more than nothing.
                termination_message_policy: Some("FallbackToLogsOnError".into()),
                volume_mounts: Some(mounts),
                ..Container::default()
            }],
            volumes: Some(volumes),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(uid),
                run_as_group: Some(uid),
                // The claim's root is made group-writable for the importer, and the
                // disk.img it leaves is the launcher's (same uid) later.
                fs_group: Some(uid),
                run_as_non_root: Some(true),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            ..PodSpec::default()
        }),
        status: None,
    })
}

fn read_only(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use serde_json::json;

    fn dv(spec: serde_json::Value) -> DataVolume {
        serde_json::from_value(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "disk", "namespace": "ns", "uid": "dv-uid",
                         "labels": {"team": "a"},
                         "annotations": {"cdi.kubevirt.io/storage.bind.immediate.requested": ""}},
            "spec": spec,
        }))
        .unwrap()
    }

    fn class(name: &str, annotation: Option<&str>, created: &str) -> StorageClass {
        let mut a = serde_json::Map::new();
        if let Some(k) = annotation {
            a.insert(k.into(), json!("true"));
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": a, "creationTimestamp": created},
            "provisioner": "p"
        }))
        .unwrap()
    }

    #[test]
    fn storage_is_completed_with_the_default_class_modes_and_the_overhead() {
        let d = dv(json!({
            "source": {"http": {"url": "http://h/i.qcow2", "checksum": "sha256:ab",
                                "extraHeaders": ["X-A: 1"]}},
            "storage": {"resources": {"requests": {"storage": "1Gi"}}}
        }));
        let classes = [
            class("plain", None, "2024-01-01T00:00:00Z"),
            class(
                "old-default",
                Some(ann::DEFAULT_STORAGE_CLASS),
                "2024-01-01T00:00:00Z",
            ),
            class(
                "new-default",
                Some(ann::DEFAULT_STORAGE_CLASS),
                "2024-02-01T00:00:00Z",
            ),
        ];
        let c = claim(&d, &classes, None).unwrap();
        let spec = c.spec.as_ref().unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("new-default"));
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(
            spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0,
            "1084Mi"
        );
        assert_eq!(c.labels()["app"], "containerized-data-importer");
        assert_eq!(c.labels()["team"], "a");
        let a = c.annotations();
        assert_eq!(a[ann::IMPORT_SOURCE], "http");
        assert_eq!(a[ann::IMPORT_ENDPOINT], "http://h/i.qcow2");
        assert_eq!(a[ann::IMPORT_CHECKSUM], "sha256:ab");
        assert_eq!(a[ann::IMPORT_EXTRA_HEADERS], r#"["X-A: 1"]"#);
        assert_eq!(a[ann::CONTENT_TYPE], "kubevirt");
        assert_eq!(a[ann::BIND_IMMEDIATE_REQUESTED], "");
        assert_eq!(a[ann::IMPORT_POD], "importer-disk");
        let o = &c.owner_references()[0];
        assert_eq!(
            (o.kind.as_str(), o.uid.as_str(), o.controller),
            ("DataVolume", "dv-uid", Some(true))
        );

        // The virtualization default comes first.
        let mut with_virt = classes.to_vec();
        with_virt.push(class(
            "virt",
            Some(ann::DEFAULT_VIRT_STORAGE_CLASS),
            "2020-01-01T00:00:00Z",
        ));
        let c = claim(&d, &with_virt, None).unwrap();
        assert_eq!(c.spec.unwrap().storage_class_name.as_deref(), Some("virt"));
        // No default at all: no class, Kubernetes decides.
        let c = claim(&d, &classes[..1], None).unwrap();
        assert_eq!(c.spec.unwrap().storage_class_name, None);
    }

    #[test]
    fn pvc_is_taken_as_written_and_block_storage_is_not_grown() {
        let d = dv(json!({
            "source": {"blank": {}},
            "pvc": {"accessModes": ["ReadWriteMany"], "storageClassName": "x",
                    "resources": {"requests": {"storage": "1Gi"}}}
        }));
        let c = claim(&d, &[], None).unwrap();
        assert_eq!(c.spec, d.spec.pvc);
        assert_eq!(c.annotations()[ann::IMPORT_SOURCE], "none");
        let d = dv(json!({
            "source": {"blank": {}},
            "storage": {"volumeMode": "Block", "resources": {"requests": {"storage": "1Gi"}}}
        }));
        let spec = claim(&d, &[], None).unwrap().spec.unwrap();
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"].0,
            "1Gi"
        );
        assert_eq!(
            claim(
                &dv(json!({"source": {"blank": {}}, "storage": {}})),
                &[],
                None
            ),
            Err(RenderError::NoSize("disk".into()))
        );
    }

    #[test]
    fn long_importer_names_are_cut_with_a_stable_hash() {
        assert_eq!(importer_pod_name("disk"), "importer-disk");
        let long = "a".repeat(60);
        let n = importer_pod_name(&long);
        assert_eq!(n.len(), 63, "{n}");
        assert!(n.starts_with("importer-aaaa"));
        assert_eq!(n, importer_pod_name(&long));
        assert_ne!(n, importer_pod_name(&"a".repeat(61)));
    }

    #[test]
    fn the_upload_server_is_unprivileged_labelled_with_its_claim_and_probed() {
        let d = dv(json!({
            "source": {"upload": {}},
            "storage": {"resources": {"requests": {"storage": "1Gi"}}}
        }));
        let c = claim(&d, &[], None).unwrap();
        assert_eq!(c.annotations()[ann::UPLOAD_TARGET], "");
        assert_eq!(worker_pod_name(&d), "cdi-upload-disk");
        let cfg = ImporterConfig {
            image: "img".into(),
            image_pull_policy: None,
        };
        let p = upload_pod(&d, &c, &cfg).unwrap();
        assert_eq!(p.name_any(), "cdi-upload-disk");
        assert_eq!(c.annotations()[ann::UPLOAD_POD], "cdi-upload-disk");
        assert_eq!(p.labels()[WORKER_LABEL], WORKER_UPLOAD);
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        let ctr = &spec.containers[0];
        assert_eq!(ctr.name, UPLOAD_CONTAINER);
        assert_eq!(
            ctr.args.as_ref().unwrap().join(" "),
            "upload-server --listen 0.0.0.0:8080 --target /data --size 1073741824 \
             --termination-log /dev/termination-log"
        );
        let probe = ctr
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(probe.path.as_deref(), Some("/healthz"));
        assert_eq!(probe.port, IntOrString::Int(8080));
        assert_eq!(
            ctr.security_context
                .as_ref()
                .unwrap()
                .allow_privilege_escalation,
            Some(false)
        );
    }

    #[test]
    fn the_importer_pod_is_unprivileged_and_writes_the_usable_size() {
        let d = dv(json!({
            "source": {"http": {"url": "https://h/i.raw", "checksum": "sha256:ab",
                                "extraHeaders": ["X-A: 1"], "certConfigMap": "ca"}},
            "storage": {"resources": {"requests": {"storage": "1Gi"}}}
        }));
        let c = claim(&d, &[], None).unwrap();
        let http = d.spec.source.as_ref().unwrap().http.as_ref().unwrap();
        let cfg = ImporterConfig {
            image: "img".into(),
            image_pull_policy: Some("IfNotPresent".into()),
        };
        let p = importer_pod(&d, http, &c, &cfg).unwrap();
        assert_eq!(p.name_any(), "importer-disk");
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("OnFailure"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(
            (psc.run_as_user, psc.run_as_group, psc.fs_group),
            (Some(107), Some(107), Some(107))
        );
        assert_eq!(
            psc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        let ctr = &spec.containers[0];
        let args = ctr.args.as_ref().unwrap().join(" ");
        // 1084 MiB × 0.945 = 1024.38 MiB → 1 GiB usable.
        assert_eq!(
            args,
            "import --url https://h/i.raw --target /data --size 1073741824 \
             --termination-log /dev/termination-log --checksum sha256:ab \
             --extra-header X-A: 1 --cert-dir /var/run/importer/certs"
        );
        let sc = ctr.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        let res = ctr.resources.as_ref().unwrap();
        assert_eq!(res.limits.as_ref().unwrap()["memory"].0, "600Mi");
        assert_eq!(res.requests.as_ref().unwrap()["cpu"].0, "10m");
        assert_eq!(p.owner_references()[0].uid, "dv-uid");
        assert_eq!(p.labels()["app"], "containerized-data-importer");
    }

    fn source_claim(size: &str, capacity: Option<&str>) -> PersistentVolumeClaim {
        let mut c = json!({"metadata": {"name": "golden", "namespace": "ns"},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": size}}}});
        if let Some(cap) = capacity {
            c["status"] = json!({"phase": "Bound", "capacity": {"storage": cap}});
        }
        serde_json::from_value(c).unwrap()
    }

    #[test]
    fn a_clone_takes_its_sources_size_unless_it_asks_for_one() {
        // storage: without a size: what the source got (its capacity), not grown again.
        let d = dv(json!({"source": {"pvc": {"name": "golden"}}, "storage": {}}));
        let src = source_claim("1084Mi", Some("2Gi"));
        let c = claim(&d, &[], Some(&src)).unwrap();
        let spec = c.spec.as_ref().unwrap();
        assert_eq!(
            spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"].0,
            "2Gi"
        );
        assert_eq!(c.annotations()[ann::CLONE_REQUEST], "ns/golden");
        assert_eq!(c.annotations()[ann::CLONE_TYPE], "copy");
        assert!(!c.annotations().contains_key(ann::IMPORT_SOURCE));
        // Not bound yet: its request.
        let c = claim(&d, &[], Some(&source_claim("1084Mi", None))).unwrap();
        assert_eq!(
            c.spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0,
            "1084Mi"
        );
        // No source (yet): no size to give.
        assert_eq!(
            claim(&d, &[], None),
            Err(RenderError::NoSize("disk".into()))
        );
        // pvc: without a size, the same.
        let d = dv(
            json!({"source": {"pvc": {"name": "golden", "namespace": "ns"}},
            "pvc": {"accessModes": ["ReadWriteOnce"]}}),
        );
        let c = claim(&d, &[], Some(&src)).unwrap();
        assert_eq!(
            c.spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0,
            "2Gi"
        );
        // A size asked for is grown as any storage: request.
        let d = dv(
            json!({"source": {"pvc": {"name": "golden"}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}),
        );
        let c = claim(&d, &[], Some(&src)).unwrap();
        assert_eq!(
            c.spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0,
            "1084Mi"
        );
    }

    #[test]
    fn the_clone_worker_mounts_the_source_read_only_and_writes_the_usable_size() {
        let d = dv(json!({"source": {"pvc": {"name": "golden"}}, "storage": {}}));
        let c = claim(&d, &[], Some(&source_claim("1084Mi", None))).unwrap();
        let cfg = ImporterConfig {
            image: "img".into(),
            image_pull_policy: None,
        };
        let pvc = d.spec.source.as_ref().unwrap().pvc.as_ref().unwrap();
        let p = clone_pod(&d, pvc, &c, &cfg).unwrap();
        assert_eq!(p.name_any(), "cdi-clone-disk");
        assert_eq!(worker_pod_name(&d), "cdi-clone-disk");
        assert_eq!(p.labels()[WORKER_LABEL], WORKER_CLONE);
        assert_eq!(p.labels()["app"], "containerized-data-importer");
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.restart_policy.as_deref(), Some("OnFailure"));
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(
            (psc.run_as_user, psc.fs_group, psc.run_as_non_root),
            (Some(107), Some(107), Some(true))
        );
        let vols = spec.volumes.as_ref().unwrap();
        let claim_of = |n: &str| {
            vols.iter()
                .find(|v| v.name == n)
                .and_then(|v| v.persistent_volume_claim.clone())
                .unwrap()
        };
        assert_eq!(claim_of("source").claim_name, "golden");
        assert_eq!(claim_of("source").read_only, Some(true));
        assert_eq!(claim_of("data").claim_name, "disk");
        let ctr = &spec.containers[0];
        assert_eq!(ctr.name, CLONE_CONTAINER);
        assert_eq!(ctr.command, Some(vec![IMPORTER_BINARY.to_string()]));
        assert_eq!(
            ctr.args.as_ref().unwrap().join(" "),
            "clone --source /source --target /data --size 1073741824 \
             --termination-log /dev/termination-log"
        );
        let mounts = ctr.volume_mounts.as_ref().unwrap();
        assert!(
            mounts.iter().any(|m| m.name == "source"
                && m.mount_path == "/source"
                && m.read_only == Some(true))
        );
        let sc = ctr.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(p.owner_references()[0].uid, "dv-uid");
        // An http DataVolume's worker is its importer.
        let h = dv(json!({"source": {"http": {"url": "http://h/i"}}, "storage": {}}));
        assert_eq!(worker_pod_name(&h), "importer-disk");
    }
}
