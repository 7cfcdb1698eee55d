//! The virt-launcher Pod of a VMI (pure).
//!
//! Contract with virt-launcher (`node/launcher/src/cli.rs`):
//! - the VMI reaches the launcher as a file through a downwardAPI volume projecting the
//!   pod annotation [`VMI_ANNOTATION`], so the pod needs no API access at all;
//! - each containerDisk (and kernelBoot container) is a Kubernetes image volume
//!   (`ImageVolume`, beta in 1.33) mounted read-only and handed over with
//!   `--image-dir IMAGE=DIR`: the kubelet pulls and unpacks it, no copier container;
//! - the console and command sockets live in an emptyDir virt-handler reaches from
//!   the node.
//!
//! Not yet rendered: network-binding plugins, PVC/ConfigMap/Secret volumes, hugepages,
//! hook sidecars, readiness gates.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource,
    ImageVolumeSource, ObjectFieldSelector, Pod, PodSpec, ResourceRequirements, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kubevirt_api::quantity;
use kubevirt_api::{API_VERSION, VirtualMachineInstance};

/// Pod annotation carrying the VMI as JSON for the launcher.
pub const VMI_ANNOTATION: &str = "kubevirt-rs.io/vmi";
/// Label selecting every launcher pod.
pub const LAUNCHER_LABEL: &str = "kubevirt.io";
/// Value of [`LAUNCHER_LABEL`] on launcher pods.
pub const LAUNCHER_LABEL_VALUE: &str = "virt-launcher";
/// Label with the uid of the VMI a launcher pod runs.
pub const CREATED_BY_LABEL: &str = "kubevirt.io/created-by";
/// Node label of nodes that run virt-handler.
pub const SCHEDULABLE_LABEL: &str = "kubevirt.io/schedulable";
/// Device-plugin resource for /dev/kvm.
pub const KVM_RESOURCE: &str = "devices.kubevirt.io/kvm";

const MIB: u64 = 1024 * 1024;
const RUN_DIR: &str = "/var/run/kubevirt-rs";

/// Cluster-wide inputs of launcher pods.
#[derive(Clone, Debug, PartialEq)]
pub struct LauncherConfig {
    /// The virt-launcher image.
    pub image: String,
    /// Pull policy of the launcher image.
    pub image_pull_policy: Option<String>,
    /// Software emulation allowed: no /dev/kvm request, the launcher may fall back to TCG.
    pub allow_emulation: bool,
    /// Fixed memory of the launcher, its libvirt daemon and QEMU, in MiB.
    pub overhead_base_mib: u64,
    /// Memory per vCPU, in MiB.
    pub overhead_per_vcpu_mib: u64,
}

impl Default for LauncherConfig {
    /// Overhead figures are KubeVirt's shape (fixed + vCPUs + guest/512) with our
    /// smaller fixed part (one process tree, no virtlogd, no monitor); to be replaced by
    /// the figure measured by `cargo xtask bench start`.
    fn default() -> Self {
        Self {
            image: "localhost/kubevirt-rs/virt-launcher:latest".into(),
            image_pull_policy: Some("IfNotPresent".into()),
            allow_emulation: false,
            overhead_base_mib: 160,
            overhead_per_vcpu_mib: 8,
        }
    }
}

/// Why a pod cannot be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PodRenderError {
    /// The VMI has no namespace or uid (not read from the API).
    #[error("VirtualMachineInstance {0} has no namespace or uid")]
    NotPersisted(String),
    /// No guest memory size anywhere in the domain.
    #[error("VirtualMachineInstance {0} specifies no guest memory")]
    NoMemory(String),
    /// A memory quantity does not parse.
    #[error("VirtualMachineInstance {name}: invalid quantity {value:?}")]
    BadQuantity {
        /// VMI name.
        name: String,
        /// The quantity.
        value: String,
    },
    /// The VMI cannot be serialised for the launcher (a bug).
    #[error("serialising VirtualMachineInstance {0}")]
    Serialize(String),
}

fn q(s: impl Into<String>) -> Quantity {
    Quantity(s.into())
}

fn mib_ceil(bytes: u64) -> u64 {
    bytes.div_ceil(MIB)
}

/// Guest RAM in bytes: memory.guest, else requests.memory, else limits.memory.
fn guest_memory(vmi: &VirtualMachineInstance) -> Result<u64, PodRenderError> {
    let name = vmi.name_any();
    let d = &vmi.spec.domain;
    let res = d.resources.as_ref();
    let value = d
        .memory
        .as_ref()
        .and_then(|m| m.guest.clone())
        .or_else(|| res.and_then(|r| r.requests.as_ref()?.get("memory").cloned()))
        .or_else(|| res.and_then(|r| r.limits.as_ref()?.get("memory").cloned()))
        .ok_or_else(|| PodRenderError::NoMemory(name.clone()))?;
    quantity::parse_bytes(&value.0).map_err(|_| PodRenderError::BadQuantity {
        name,
        value: value.0,
    })
}

fn vcpus(vmi: &VirtualMachineInstance) -> u64 {
    let cpu = vmi.spec.domain.cpu.as_ref();
    let f = |v: Option<u32>| u64::from(v.unwrap_or(1).max(1));
    f(cpu.and_then(|c| c.cores)) * f(cpu.and_then(|c| c.sockets)) * f(cpu.and_then(|c| c.threads))
}

/// Memory the pod needs beyond the guest RAM, in MiB.
pub fn memory_overhead_mib(
    vmi: &VirtualMachineInstance,
    cfg: &LauncherConfig,
) -> Result<u64, PodRenderError> {
    let guest = guest_memory(vmi)?;
    // Page tables and QEMU's per-RAM bookkeeping grow with guest RAM.
    Ok(cfg.overhead_base_mib + cfg.overhead_per_vcpu_mib * vcpus(vmi) + mib_ceil(guest / 512))
}

fn owner(vmi: &VirtualMachineInstance, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: API_VERSION.into(),
        kind: "VirtualMachineInstance".into(),
        name: vmi.name_any(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Image volumes for containerDisks and the kernelBoot container, as
/// (volume name, image, pull policy), one per distinct image.
fn images(vmi: &VirtualMachineInstance) -> Vec<(String, String, Option<String>)> {
    let mut out: Vec<(String, String, Option<String>)> = vmi
        .spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            let cd = v.container_disk.as_ref()?;
            Some((
                format!("image-{}", v.name),
                cd.image.clone(),
                cd.image_pull_policy.clone(),
            ))
        })
        .collect();
    if let Some(kb) = vmi
        .spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        .and_then(|k| k.container.as_ref())
    {
        out.push((
            "kernel-boot".into(),
            kb.image.clone(),
            kb.image_pull_policy.clone(),
        ));
    }
    // The launcher maps images, not volumes: one mount per distinct image suffices.
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|(_, image, _)| seen.insert(image.clone()));
    out
}

/// Renders the launcher pod of `vmi`.
pub fn launcher_pod(
    vmi: &VirtualMachineInstance,
    cfg: &LauncherConfig,
) -> Result<Pod, PodRenderError> {
    let name = vmi.name_any();
    let (Some(ns), Some(uid)) = (vmi.namespace(), vmi.metadata.uid.clone()) else {
        return Err(PodRenderError::NotPersisted(name));
    };
    let spec = &vmi.spec;
    let guest_mib = mib_ceil(guest_memory(vmi)?);
    let overhead_mib = memory_overhead_mib(vmi, cfg)?;

    let mut labels = vmi.labels().clone();
    labels.insert(LAUNCHER_LABEL.into(), LAUNCHER_LABEL_VALUE.into());
    labels.insert(CREATED_BY_LABEL.into(), uid.clone());
    labels.insert("vm.kubevirt.io/name".into(), name.clone());

    // Only what the launcher needs: no status, no managed fields.
    let for_launcher = serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": spec,
    });
    let vmi_json = serde_json::to_string(&for_launcher)
        .map_err(|_| PodRenderError::Serialize(name.clone()))?;

    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    let res = spec.domain.resources.as_ref();
    requests.insert(
        "memory".to_string(),
        q(format!("{}Mi", guest_mib + overhead_mib)),
    );
    match res.and_then(|r| r.requests.as_ref()?.get("cpu").cloned()) {
        Some(cpu) => requests.insert("cpu".into(), cpu),
        None => requests.insert("cpu".into(), q("100m")),
    };
    if let Some(mem) = res.and_then(|r| r.limits.as_ref()?.get("memory").cloned()) {
        let bytes = quantity::parse_bytes(&mem.0).map_err(|_| PodRenderError::BadQuantity {
            name: name.clone(),
            value: mem.0.clone(),
        })?;
        limits.insert(
            "memory".into(),
            q(format!("{}Mi", mib_ceil(bytes) + overhead_mib)),
        );
    }
    if let Some(cpu) = res.and_then(|r| r.limits.as_ref()?.get("cpu").cloned()) {
        limits.insert("cpu".into(), cpu);
    }
    if !cfg.allow_emulation {
        // Extended resources: the request defaults to the limit.
        limits.insert(KVM_RESOURCE.into(), q("1"));
    }

    let images = images(vmi);
    let mut args = vec![
        "--vmi".to_string(),
        format!("{RUN_DIR}/vmi/vmi.json"),
        "--console-socket".into(),
        format!("{RUN_DIR}/sockets/console.sock"),
        "--cmd-socket".into(),
        format!("{RUN_DIR}/sockets/cmd.sock"),
        "--work-dir".into(),
        format!("{RUN_DIR}/private"),
    ];
    if !cfg.allow_emulation {
        args.push("--no-emulation".into());
    }
    for (vol, image, _) in &images {
        args.push("--image-dir".into());
        args.push(format!("{image}={RUN_DIR}/images/{vol}"));
    }

    let mount = |name: &str, path: String, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path,
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    let mut mounts = vec![
        mount("vmi", format!("{RUN_DIR}/vmi"), true),
        mount("sockets", format!("{RUN_DIR}/sockets"), false),
        mount("private", format!("{RUN_DIR}/private"), false),
    ];
    let empty = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    };
    let mut volumes = vec![
        Volume {
            name: "vmi".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: "vmi.json".into(),
                    field_ref: Some(ObjectFieldSelector {
                        field_path: format!("metadata.annotations['{VMI_ANNOTATION}']"),
                        api_version: None,
                    }),
                    ..DownwardAPIVolumeFile::default()
                }]),
                ..DownwardAPIVolumeSource::default()
            }),
            ..Volume::default()
        },
        empty("sockets"),
        empty("private"),
    ];
    for (vol, image, pull) in &images {
        mounts.push(mount(vol, format!("{RUN_DIR}/images/{vol}"), true));
        volumes.push(Volume {
            name: vol.clone(),
            image: Some(ImageVolumeSource {
                reference: Some(image.clone()),
                pull_policy: pull.clone(),
            }),
            ..Volume::default()
        });
    }

    let mut node_selector = spec.node_selector.clone().unwrap_or_default();
    node_selector.insert(SCHEDULABLE_LABEL.into(), "true".into());

    Ok(Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("virt-launcher-{name}-")),
            namespace: Some(ns),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(VMI_ANNOTATION.to_string(), vmi_json)])),
            owner_references: Some(vec![owner(vmi, &uid)]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            // The guest's own grace period plus time for the launcher to tear down.
            termination_grace_period_seconds: Some(
                spec.termination_grace_period_seconds.unwrap_or(30) + 30,
            ),
            automount_service_account_token: Some(false),
            node_selector: Some(node_selector),
            affinity: spec.affinity.clone(),
            tolerations: spec.tolerations.clone(),
            scheduler_name: spec.scheduler_name.clone(),
            priority_class_name: spec.priority_class_name.clone(),
            hostname: Some(spec.hostname.clone().unwrap_or_else(|| name.clone())),
            subdomain: spec.subdomain.clone(),
            dns_policy: spec.dns_policy.clone(),
            dns_config: spec.dns_config.clone(),
            containers: vec![Container {
                name: "compute".into(),
                image: Some(cfg.image.clone()),
                image_pull_policy: cfg.image_pull_policy.clone(),
                command: Some(vec!["/usr/bin/virt-launcher".into()]),
                args: Some(args),
                resources: Some(ResourceRequirements {
                    requests: Some(requests),
                    limits: (!limits.is_empty()).then_some(limits),
                    ..ResourceRequirements::default()
                }),
                volume_mounts: Some(mounts),
                ..Container::default()
            }],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        status: None,
    })
}
