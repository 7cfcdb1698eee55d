//! The virt-launcher Pod of a VMI (pure). The contract is docs/cluster-flow.md §2.
//!
//! - The VMI reaches the launcher as a file through a downwardAPI volume projecting the
//!   pod annotation [`VMI_ANNOTATION`], so the pod needs no API access at all.
//! - Container images of the VMI (containerDisks, the kernelBoot container) are copied
//!   out by the pod's own containers: the local cluster's containerd 1.6 has no image
//!   volumes. The init container `virt-bin` puts the launcher image's static busybox in an
//!   emptyDir, then one container per distinct image (`image-N`, beside the launcher, as
//!   KubeVirt's `volumecontainerdisk`) runs that busybox inside the image, copies exactly
//!   the files the launcher opens and lives as long as the launcher ([`copier_script`]);
//!   the launcher gets `--image-dir IMAGE=DIR` and waits for each copy.
//! - The command, console and VNC sockets live in an emptyDir: the pod has no hostPath at
//!   all (Pod Security `restricted` admits it). virt-handler reaches the directory through
//!   `/proc/<pid>/root` of the compute container, the pod found by the uid the VMI's
//!   `status.activePods` names (docs/node.md, "Privilege model").
//! - PersistentVolumeClaim volumes are mounted where KubeVirt mounts them ([`CLAIMS_DIR`]),
//!   Block-mode claims as devices; how, the VMI's `status.volumeStatus` says (recorded by
//!   the VMI controller from the claims before it renders), so the pod is still a
//!   function of the VMI alone (a migration target's too).
//!
//! Not yet rendered: network-binding plugins, ConfigMap/Secret volumes, hugepages,
//! hook sidecars, readiness gates.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, LocalObjectReference, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, ResourceRequirements,
    SeccompProfile, Secret, SecretVolumeSource, SecurityContext, Volume, VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kubevirt_api::{API_VERSION, LAUNCHER_UID, VirtualMachineInstance};
use kubevirt_api::{cloudinit, quantity};

use super::claims;

/// Pod annotation carrying the VMI as JSON for the launcher.
pub const VMI_ANNOTATION: &str = "kubevirt-rs.io/vmi";
/// Label selecting every launcher pod.
pub const LAUNCHER_LABEL: &str = kubevirt_api::COMPONENT_LABEL;
/// Value of [`LAUNCHER_LABEL`] on launcher pods.
pub const LAUNCHER_LABEL_VALUE: &str = kubevirt_api::LAUNCHER_COMPONENT;
/// Label with the uid of the VMI a launcher pod runs.
pub const CREATED_BY_LABEL: &str = kubevirt_api::CREATED_BY_LABEL;
/// Label with the name of the VMI a launcher pod runs.
pub const VM_NAME_LABEL: &str = kubevirt_api::VM_NAME_LABEL;
/// VMI label naming the node its launcher runs on.
pub const NODE_NAME_LABEL: &str = "kubevirt.io/nodeName";
/// Device-plugin resource for /dev/kvm.
pub const KVM_RESOURCE: &str = "devices.kubevirt.io/kvm";
/// Name of the launcher container.
pub const COMPUTE_CONTAINER: &str = "compute";
/// Seconds the pod's grace period adds to the VMI's, for the launcher's teardown.
pub const GRACE_PADDING_SECONDS: i64 = 15;

const MIB: u64 = 1024 * 1024;
const RUN_DIR: &str = "/var/run/kubevirt-rs";
const SOCKETS_DIR: &str = "/var/run/kubevirt-rs/sockets";
const IMAGES_DIR: &str = "/var/run/kubevirt-rs/images";
/// Where the launcher finds cloud-init data from Secrets (`kubevirt_api::cloudinit`).
const CLOUD_INIT_DIR: &str = "/var/run/kubevirt-rs/cloud-init";
/// Where the launcher finds the Secrets of the access credentials, each in
/// `<secret>-access-cred` (KubeVirt's names).
const ACCESS_CREDENTIALS_DIR: &str = "/var/run/kubevirt-rs/access-credentials";
/// Filesystem-mode claims, one directory per volume (KubeVirt's path).
pub const CLAIMS_DIR: &str = "/var/run/kubevirt-private/vmi-disks";
/// Block-mode claims, one device node per volume.
pub const CLAIM_DEVICES_DIR: &str = "/dev/vmi-disks";
/// The launcher's QEMU capabilities cache (an emptyDir virt-handler fills).
pub const LIBVIRT_CACHE_DIR: &str = "/var/cache/kubevirt-rs/libvirt";
const VIRT_BIN_DIR: &str = "/virt-bin";
const BUSYBOX: &str = "/usr/bin/busybox";
const LAUNCHER_BINARY: &str = "/usr/bin/virt-launcher";
/// The console-log tail, a small binary of the launcher image (KubeVirt's name).
const TAIL_BINARY: &str = "/usr/bin/virt-tail";
/// KubeVirt's name of the container that streams the serial console to the pod's log.
pub const CONSOLE_LOG_CONTAINER: &str = "guest-console-log";
/// Shared by the compute container (QEMU writes) and the log container (reads, empties).
const CONSOLE_LOG_DIR: &str = "/var/run/kubevirt-rs/console-log";
const CONSOLE_LOG_FILE: &str = "/var/run/kubevirt-rs/console-log/serial0.log";
/// The launcher's lifeline: a FIFO it holds open for its whole life, which the pod's
/// sidecars (image copiers, console-log tail) read until it hangs up (the kernel closes
/// it however the launcher ends), in a directory of its own that only the compute
/// container writes.
const LIFE_DIR: &str = "/var/run/kubevirt-rs/life";
const LIFELINE: &str = "/var/run/kubevirt-rs/life/launcher";
/// Written by the launcher when it ends in an orderly way (errors included): a copier
/// that had not reached the lifeline yet stops waiting for it.
const LIFELINE_ENDED: &str = "/var/run/kubevirt-rs/life/ended";

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
    /// The cluster's default of `domain.devices.logSerialConsole`.
    pub serial_console_log: bool,
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
            serial_console_log: true,
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
    /// A claim volume whose claim the VMI controller has not recorded in
    /// `status.volumeStatus` (it does before it renders the pod).
    #[error("volume {0}: its PersistentVolumeClaim is not known yet")]
    UnknownClaim(String),
    /// A path inside a container image is empty or leaves the image (`..`).
    #[error("volume {volume}: invalid path in image {path:?}")]
    BadImagePath {
        /// Volume name (`kernelBoot` for the kernel and initrd).
        volume: String,
        /// The path.
        path: String,
    },
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

/// The pod hostname of a VMI without `spec.hostname`: its name made a DNS label (a
/// VMI name may hold dots and 253 characters, a hostname neither), as KubeVirt's
/// `SanitizeHostname`.
pub fn hostname_of(name: &str) -> String {
    let label: String = name.replace('.', "-").chars().take(63).collect();
    label.trim_end_matches('-').to_string()
}

/// A container image the launcher reads files from, with the files it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageCopy {
    /// Image reference as written in the VMI (the key of `--image-dir`).
    pub image: String,
    /// Pull policy of the first volume naming the image.
    pub pull_policy: Option<String>,
    /// Absolute paths inside the image, in first-use order, without duplicates.
    pub files: Vec<String>,
}

/// Checks a path inside an image: absolute after normalising, no `..`, not `/`.
fn image_path(volume: &str, path: &str) -> Result<String, PodRenderError> {
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(PodRenderError::BadImagePath {
                    volume: volume.into(),
                    path: path.into(),
                });
            }
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return Err(PodRenderError::BadImagePath {
            volume: volume.into(),
            path: path.into(),
        });
    }
    Ok(format!("/{}", parts.join("/")))
}

/// The images of containerDisks and the kernelBoot container, one per distinct image
/// (the launcher maps images, not volumes), with exactly the files the launcher opens:
/// a containerDisk's `path` (else KubeVirt's `/disk` directory), the kernel and initrd.
pub fn image_copies(vmi: &VirtualMachineInstance) -> Result<Vec<ImageCopy>, PodRenderError> {
    // (image, pull policy, path in the image), in VMI order.
    let mut wanted: Vec<(&str, Option<&String>, String)> = Vec::new();
    for v in vmi.spec.volumes.iter().flatten() {
        if let Some(cd) = &v.container_disk {
            let path = image_path(&v.name, cd.path.as_deref().unwrap_or("/disk"))?;
            wanted.push((&cd.image, cd.image_pull_policy.as_ref(), path));
        }
    }
    if let Some(kb) = vmi
        .spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        .and_then(|k| k.container.as_ref())
    {
        for p in [&kb.kernel_path, &kb.initrd_path].into_iter().flatten() {
            let path = image_path("kernelBoot", p)?;
            wanted.push((&kb.image, kb.image_pull_policy.as_ref(), path));
        }
    }
    let mut out: Vec<ImageCopy> = Vec::new();
    for (image, pull, path) in wanted {
        let i = match out.iter().position(|c| c.image == image) {
            Some(i) => i,
            None => {
                out.push(ImageCopy {
                    image: image.to_string(),
                    pull_policy: pull.cloned(),
                    files: Vec::new(),
                });
                out.len() - 1
            }
        };
        if !out[i].files.contains(&path) {
            out[i].files.push(path);
        }
    }
    Ok(out)
}

/// Quotes `s` for `sh -c`: image paths come from users.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The shell function copying one image path: regular files and directories only. A
/// symbolic link, device or FIFO in an image is refused with a message naming it (it
/// becomes the VMI's failure message): the launcher must never open one (a link to a
/// host device is the class of KubeVirt advisory GHSA-qv98-3369-g364). `find` does not
/// follow links, the path itself included, so nothing but regular files reaches `cp`.
pub const COPY_FN: &str = "copy() { bad=$(find \"$1\" ! -type f ! -type d 2>/dev/null | head -n 1); \
     if [ -n \"$bad\" ]; then echo \"$bad in the image is not a regular file or directory \
     (symbolic links, devices and FIFOs are refused)\" >&2; exit 1; fi; cp -R \"$1\" \"$2\"; }";

/// The command of an image's copier container, which runs beside the launcher for the
/// launcher's whole life: copy ([`copy_script`]), then leave `DIR.done` for the launcher
/// (or `DIR.failed` with the error, and fail), then live until the launcher ends. A
/// container that ended earlier would make the pod NotReady and take the VM out of its
/// Services; one that outlived the launcher would keep the pod Running after the guest.
///
/// The copier learns the launcher's end from [`LIFELINE`], a FIFO the launcher holds open
/// as a writer: `cat` on it returns at end-of-file, when the launcher is gone however it
/// ended (an OOM kill included). Opening a FIFO nobody holds blocks, so a launcher that
/// ended before the copier opened it must be seen otherwise: by [`LIFELINE_ENDED`], which
/// it writes when it ends in an orderly way, or, for a kill in that instant, after 30 s.
/// The blocked `cat` is then killed with SIGKILL: a SIGTERM reaching the forked shell
/// before it became `cat` would run the inherited trap instead and be lost.
pub fn copier_script(copy: &ImageCopy, dir: &str) -> String {
    copier_script_with(copy, dir, LIFELINE, LIFELINE_ENDED)
}

/// [`copier_script`] with the lifeline elsewhere (tests run it on the host).
pub fn copier_script_with(copy: &ImageCopy, dir: &str, lifeline: &str, ended: &str) -> String {
    let done = sh_quote(&format!("{dir}.done"));
    let failed = sh_quote(&format!("{dir}.failed"));
    let failed_tmp = sh_quote(&format!("{dir}.failed.tmp"));
    let (life, ended) = (sh_quote(lifeline), sh_quote(ended));
    format!(
        "trap 'exit 0' TERM INT; \
         if out=$( ( {copy} ) 2>&1 ); then : > {done}; \
         else printf '%s\\n' \"$out\" >&2; printf '%s\\n' \"$out\" > {failed_tmp}; \
         mv {failed_tmp} {failed}; exit 1; fi; \
         n=0; until [ -p {life} ]; do [ -e {ended} ] && exit 0; n=$((n+1)); \
         [ $n -gt 3000 ] && exit 0; sleep 0.1; done; [ -e {ended} ] && exit 0; \
         cat {life} > /dev/null & c=$!; \
         n=0; until [ -e /proc/$c/fd/3 ]; do [ -e {ended} ] && break; n=$((n+1)); \
         [ $n -gt 300 ] && break; sleep 0.1; done; \
         [ -e /proc/$c/fd/3 ] || kill -9 $c 2>/dev/null; wait $c; exit 0",
        copy = copy_script(copy, dir),
    )
}

/// The shell script of an image's copier: create the parents, then copy each file
/// (or directory) to the same path under `dir`, regular files only ([`COPY_FN`]).
pub fn copy_script(copy: &ImageCopy, dir: &str) -> String {
    let mut parents: Vec<String> = vec![dir.to_string()];
    for f in &copy.files {
        if let Some((parent, _)) = f.rsplit_once('/')
            && !parent.is_empty()
        {
            let p = format!("{dir}{parent}");
            if !parents.contains(&p) {
                parents.push(p);
            }
        }
    }
    let mut script = format!(
        "{COPY_FN}; mkdir -p {}",
        parents
            .iter()
            .map(|p| sh_quote(p))
            .collect::<Vec<_>>()
            .join(" ")
    );
    for f in &copy.files {
        script.push_str(&format!(
            " && copy {} {}",
            sh_quote(f),
            sh_quote(&format!("{dir}{f}"))
        ));
    }
    script
}

/// The Secret holding the VMI's inline cloud-init data for its launcher pods (none when
/// it has none), owned by the VMI so that it goes with it.
pub fn cloud_init_secret(vmi: &VirtualMachineInstance) -> Result<Option<Secret>, PodRenderError> {
    let name = vmi.name_any();
    let (Some(ns), Some(uid)) = (vmi.namespace(), vmi.metadata.uid.clone()) else {
        return Err(PodRenderError::NotPersisted(name));
    };
    let data = cloudinit::take_inline(&mut vmi.spec.clone());
    if data.is_empty() {
        return Ok(None);
    }
    Ok(Some(Secret {
        metadata: ObjectMeta {
            name: Some(cloudinit::secret_name(&uid)),
            namespace: Some(ns),
            labels: Some(BTreeMap::from([(
                CREATED_BY_LABEL.to_string(),
                uid.clone(),
            )])),
            owner_references: Some(vec![owner(vmi, &uid)]),
            ..ObjectMeta::default()
        },
        string_data: Some(data),
        type_: Some("Opaque".into()),
        ..Secret::default()
    }))
}

/// Renders the launcher pod of `vmi` (contract: docs/cluster-flow.md §2).
pub fn launcher_pod(
    vmi: &VirtualMachineInstance,
    cfg: &LauncherConfig,
) -> Result<Pod, PodRenderError> {
    // DataVolume volumes are their claims, for the pod and for the launcher.
    let normalized = claims::as_claims(vmi);
    let vmi: &VirtualMachineInstance = &normalized;
    let name = vmi.name_any();
    let (Some(ns), Some(uid)) = (vmi.namespace(), vmi.metadata.uid.clone()) else {
        return Err(PodRenderError::NotPersisted(name));
    };
    let spec = &vmi.spec;
    let guest_mib = mib_ceil(guest_memory(vmi)?);
    let overhead_mib = memory_overhead_mib(vmi, cfg)?;

    let mut labels = vmi.labels().clone();
    // The VMI's node label belongs to the VMI, not to a pod that may land elsewhere; and
    // a new pod runs the current launcher, whatever the VMI's present one (a migration
    // target rendered while the VMI is labelled outdated must not start labelled).
    labels.remove(NODE_NAME_LABEL);
    labels.remove(crate::workload::decide::OUTDATED_LAUNCHER_IMAGE_LABEL);
    labels.insert(LAUNCHER_LABEL.into(), LAUNCHER_LABEL_VALUE.into());
    labels.insert(CREATED_BY_LABEL.into(), uid.clone());
    // Label values stop at 63 characters, VMI names at 253: a longer name would make
    // the pod invalid, and a truncated one would name another VMI.
    if name.len() <= 63 {
        labels.insert(VM_NAME_LABEL.into(), name.clone());
    }

    // Only what the launcher needs: no status, no managed fields, and no inline
    // cloud-init data (pod annotations are readable by `view`): that goes through
    // [`cloud_init_secret`].
    let mut launcher_spec = spec.clone();
    let inline_cloud_init = !cloudinit::take_inline(&mut launcher_spec).is_empty();
    let for_launcher = serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": launcher_spec,
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

    let copies = image_copies(vmi)?;
    let image_dir = |n: usize| format!("{IMAGES_DIR}/{n}");
    let mut args = vec![
        "--vmi".to_string(),
        format!("{RUN_DIR}/vmi/vmi.json"),
        "--cmd-socket".into(),
        format!("{SOCKETS_DIR}/cmd.sock"),
        "--console-socket".into(),
        format!("{SOCKETS_DIR}/console.sock"),
        "--vnc-socket".into(),
        format!("{SOCKETS_DIR}/vnc.sock"),
        "--work-dir".into(),
        format!("{RUN_DIR}/work"),
    ];
    for (n, c) in copies.iter().enumerate() {
        args.push("--image-dir".into());
        args.push(format!("{}={}", c.image, image_dir(n)));
    }
    if !cfg.allow_emulation {
        args.push("--no-emulation".into());
    }

    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    let empty = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    };
    let mut mounts = vec![
        mount("vmi", &format!("{RUN_DIR}/vmi"), true),
        mount("sockets", SOCKETS_DIR, false),
        mount("work", &format!("{RUN_DIR}/work"), false),
        mount("libvirt-cache", LIBVIRT_CACHE_DIR, false),
        // The root filesystem is read-only; libvirt and QEMU write below the work
        // directory, anything else that wants a temporary file here.
        mount("tmp", "/tmp", false),
    ];
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
        empty("work"),
        // The pod's own QEMU capabilities cache: virt-handler fills it from its node's
        // (probed once per node by its own init container) before the launcher starts
        // libvirt. Never shared between pods: one launcher could poison another's.
        empty("libvirt-cache"),
        empty("tmp"),
    ];

    // cloud-init data in Secrets: ours of the inline data, and those the VMI names.
    let secret_volume = |volume: &str, secret: &str| Volume {
        name: volume.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    };
    let mut cloud_init_mounts = Vec::new();
    if inline_cloud_init {
        cloud_init_mounts.push((
            cloudinit::INLINE_DIR.to_string(),
            cloudinit::secret_name(&uid),
        ));
    }
    for v in spec.volumes.iter().flatten() {
        for src in [&v.cloud_init_no_cloud, &v.cloud_init_config_drive]
            .into_iter()
            .flatten()
        {
            for (kind, r) in [
                (cloudinit::RefKind::User, &src.secret_ref),
                (cloudinit::RefKind::Network, &src.network_data_secret_ref),
            ] {
                if let Some(r) = r {
                    cloud_init_mounts.push((cloudinit::ref_dir(&v.name, kind), r.name.clone()));
                }
            }
        }
    }
    for (n, (dir, secret)) in cloud_init_mounts.iter().enumerate() {
        let volume = format!("cloud-init-{n}");
        mounts.push(mount(&volume, &format!("{CLOUD_INIT_DIR}/{dir}"), true));
        volumes.push(secret_volume(&volume, secret));
    }
    if !cloud_init_mounts.is_empty() {
        args.push("--cloud-init-dir".into());
        args.push(CLOUD_INIT_DIR.into());
    }

    // The access credentials' Secrets, each once. Optional, unlike KubeVirt's: a missing
    // Secret does not hold the VM's start (its pod would wait in ContainerCreating with
    // only an Event saying why); the launcher names it in `AccessCredentialsSynchronized`
    // and kubelet fills the directory when the Secret appears, as it does on every change.
    let mut credential_secrets: Vec<&str> = spec
        .access_credentials
        .iter()
        .flatten()
        .filter_map(|c| c.secret_name())
        .collect();
    credential_secrets.sort_unstable();
    credential_secrets.dedup();
    for (n, secret) in credential_secrets.iter().enumerate() {
        let volume = format!("access-cred-{n}");
        mounts.push(mount(
            &volume,
            &format!(
                "{ACCESS_CREDENTIALS_DIR}/{}",
                cloudinit::access_credential_dir(secret)
            ),
            true,
        ));
        let mut v = secret_volume(&volume, secret);
        if let Some(s) = v.secret.as_mut() {
            s.optional = Some(true);
        }
        volumes.push(v);
    }
    if !credential_secrets.is_empty() {
        args.push("--access-credentials-dir".into());
        args.push(ACCESS_CREDENTIALS_DIR.into());
    }

    // Claims, where KubeVirt mounts them: a Filesystem-mode claim as a directory (the
    // launcher finds or creates disk.img in it), a Block-mode claim as a device node.
    let mut devices = Vec::new();
    let claim_volumes = spec
        .volumes
        .iter()
        .flatten()
        // Hotplugged ones come by their attachment pods (vmi::hotplug).
        .filter(|v| !kubevirt_api::hotplug::is_hotpluggable(v))
        .filter_map(|v| Some((v.name.as_str(), v.persistent_volume_claim.as_ref()?)));
    for (n, (volume, pvc)) in claim_volumes.enumerate() {
        let presented = claims::presented(vmi, volume)
            .ok_or_else(|| PodRenderError::UnknownClaim(volume.into()))?;
        // Pod volume names are ours, never the user's: a VMI volume may be called "work".
        let pod_volume = format!("claim-{n}");
        volumes.push(Volume {
            name: pod_volume.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: pvc.claim_name.clone(),
                read_only: pvc.read_only,
            }),
            ..Volume::default()
        });
        let path = match presented.mode {
            claims::Mode::Filesystem => {
                let dir = format!("{CLAIMS_DIR}/{volume}");
                mounts.push(mount(&pod_volume, &dir, pvc.read_only == Some(true)));
                dir
            }
            claims::Mode::Block => {
                let dev = format!("{CLAIM_DEVICES_DIR}/{volume}");
                devices.push(VolumeDevice {
                    name: pod_volume,
                    device_path: dev.clone(),
                });
                dev
            }
        };
        args.push("--claim".into());
        args.push(format!("{volume}={path}"));
        if let Some(size) = presented.disk_img_size {
            args.push("--claim-disk-size".into());
            args.push(format!("{volume}={size}"));
        }
    }

    // containerd 1.6 has no image volumes: like KubeVirt, a static busybox from the
    // launcher image runs inside each disk image and copies the files out. Only the
    // busybox copy is an init container: the kubelet starts the next container of a pod
    // only after its relist (every second) has seen the previous init container exit, so
    // the copiers run beside the launcher, which waits for their `.done` files
    // ([`copier_script`]) while it starts.
    // Where virt-handler mounts hotplugged volumes' images (vmi::hotplug): an emptyDir, so
    // that the directory is writable under the read-only root and the mounts go with it.
    mounts.push(mount(
        "hotplug-disks",
        kubevirt_api::hotplug::LAUNCHER_HOTPLUG_DIR,
        false,
    ));
    volumes.push(empty("hotplug-disks"));
    let console_log = serial_console_log(vmi, cfg);
    if console_log {
        args.push("--console-log".into());
        args.push(CONSOLE_LOG_FILE.into());
        mounts.push(mount("console-log", CONSOLE_LOG_DIR, false));
        volumes.push(empty("console-log"));
    }
    // Guaranteed QoS (limits for both) must survive the second container.
    let guaranteed = limits.contains_key("cpu") && limits.contains_key("memory");

    let mut init_containers = Vec::new();
    let mut copiers = Vec::new();
    let mut lifeline_env = Vec::new();
    // Every sidecar ends with the launcher by its lifeline.
    if !copies.is_empty() || console_log {
        mounts.push(mount("life", LIFE_DIR, false));
        volumes.push(empty("life"));
        lifeline_env.push(EnvVar {
            name: kubevirt_api::LAUNCHER_LIFELINE_ENV.into(),
            value: Some(LIFELINE.into()),
            ..EnvVar::default()
        });
    }
    if !copies.is_empty() {
        mounts.push(mount("images", IMAGES_DIR, true));
        volumes.push(empty("virt-bin"));
        volumes.push(empty("images"));
        args.push("--await-image-copies".into());
        let no_term_log = || Some("FallbackToLogsOnError".to_string());
        init_containers.push(Container {
            name: "virt-bin".into(),
            image: Some(cfg.image.clone()),
            image_pull_policy: cfg.image_pull_policy.clone(),
            command: Some(vec![
                BUSYBOX.into(),
                "cp".into(),
                BUSYBOX.into(),
                format!("{VIRT_BIN_DIR}/busybox"),
            ]),
            volume_mounts: Some(vec![mount("virt-bin", VIRT_BIN_DIR, false)]),
            termination_message_policy: no_term_log(),
            security_context: Some(unprivileged()),
            ..Container::default()
        });
        for (n, c) in copies.iter().enumerate() {
            copiers.push(Container {
                name: format!("image-{n}"),
                image: Some(c.image.clone()),
                image_pull_policy: c.pull_policy.clone(),
                command: Some(vec![
                    format!("{VIRT_BIN_DIR}/busybox"),
                    "sh".into(),
                    "-c".into(),
                    copier_script(c, &image_dir(n)),
                ]),
                resources: Some(copier_resources(guaranteed)),
                volume_mounts: Some(vec![
                    mount("virt-bin", VIRT_BIN_DIR, true),
                    mount("images", IMAGES_DIR, false),
                    mount("life", LIFE_DIR, true),
                ]),
                termination_message_policy: no_term_log(),
                security_context: Some(unprivileged()),
                ..Container::default()
            });
        }
    }

    let mut pull_secrets: Vec<LocalObjectReference> = Vec::new();
    let secrets = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.container_disk.as_ref()?.image_pull_secret.clone())
        .chain(spec.domain.firmware.as_ref().and_then(|f| {
            f.kernel_boot
                .as_ref()?
                .container
                .as_ref()?
                .image_pull_secret
                .clone()
        }));
    for s in secrets {
        if !pull_secrets.iter().any(|r| r.name == s) {
            pull_secrets.push(LocalObjectReference { name: s });
        }
    }

    Ok(Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!(
                "{}{name}-",
                kubevirt_api::eviction::LAUNCHER_POD_PREFIX
            )),
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
                spec.termination_grace_period_seconds.unwrap_or(30) + GRACE_PADDING_SECONDS,
            ),
            automount_service_account_token: Some(false),
            node_selector: spec.node_selector.clone(),
            affinity: spec.affinity.clone(),
            tolerations: spec.tolerations.clone(),
            scheduler_name: spec.scheduler_name.clone(),
            priority_class_name: spec.priority_class_name.clone(),
            hostname: Some(spec.hostname.clone().unwrap_or_else(|| hostname_of(&name))),
            subdomain: spec.subdomain.clone(),
            dns_policy: spec.dns_policy.clone(),
            dns_config: spec.dns_config.clone(),
            image_pull_secrets: (!pull_secrets.is_empty()).then_some(pull_secrets),
            init_containers: (!init_containers.is_empty()).then_some(init_containers),
            containers: [Container {
                name: COMPUTE_CONTAINER.into(),
                image: Some(cfg.image.clone()),
                image_pull_policy: cfg.image_pull_policy.clone(),
                command: Some(vec![LAUNCHER_BINARY.into()]),
                args: Some(args),
                // The launcher reports the pod IP as the VMI's interface address; the
                // kubelet knows it, the launcher's own route lookup may not (no default
                // route on some pod networks).
                env: Some(
                    vec![
                        field_env("POD_IP", "status.podIP"),
                        // Expands the sockets subpath.
                        field_env("NODE_NAME", "spec.nodeName"),
                        // The interface on the pod network is a tap virt-handler builds in
                        // this pod (docs/design-node-privilege-and-network.md).
                        EnvVar {
                            name: "VIRT_LAUNCHER_NETWORK".into(),
                            value: Some("pod".into()),
                            ..EnvVar::default()
                        },
                        // libvirt's client library reads its configuration below $HOME; the
                        // root filesystem is read-only.
                        EnvVar {
                            name: "HOME".into(),
                            value: Some(format!("{RUN_DIR}/work")),
                            ..EnvVar::default()
                        },
                    ]
                    .into_iter()
                    .chain(lifeline_env)
                    .collect(),
                ),
                resources: Some(ResourceRequirements {
                    requests: Some(requests),
                    limits: (!limits.is_empty()).then_some(limits),
                    ..ResourceRequirements::default()
                }),
                // No privilege at all: libvirt runs in session mode as the launcher user,
                // virt-handler builds the network and the tap device node for it
                // (docs/node.md, "Privilege model").
                security_context: Some(unprivileged()),
                termination_message_policy: Some("FallbackToLogsOnError".into()),
                volume_mounts: Some(mounts),
                volume_devices: (!devices.is_empty()).then_some(devices),
                ..Container::default()
            }]
            .into_iter()
            .chain(copiers)
            .chain(console_log.then(|| console_log_container(cfg, guaranteed)))
            .collect(),
            volumes: Some(volumes),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(LAUNCHER_UID.into()),
                run_as_group: Some(LAUNCHER_UID.into()),
                run_as_non_root: Some(true),
                // emptyDirs (work, images) group-writable by the launcher user.
                fs_group: Some(LAUNCHER_UID.into()),
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

/// KubeVirt's rule: not without the auto-attached serial console; then the VMI's
/// `logSerialConsole`, else the cluster's default.
pub fn serial_console_log(vmi: &VirtualMachineInstance, cfg: &LauncherConfig) -> bool {
    let devices = &vmi.spec.domain.devices;
    devices.autoattach_serial_console != Some(false)
        && devices.log_serial_console.unwrap_or(cfg.serial_console_log)
}

/// `guest-console-log`: `virt-tail` copies the file QEMU logs the serial console to onto
/// its stdout, so `kubectl logs POD -c guest-console-log` shows the guest's console with
/// kubelet's timestamps (node/launcher/src/console_log.rs). It ends with the launcher (its
/// lifeline hangs up), so the pod completes with the guest.
fn console_log_container(cfg: &LauncherConfig, guaranteed: bool) -> Container {
    // A tail mostly asleep in poll (about a MiB resident: it maps no libvirt); the limits
    // stop a guest that floods its console from taking more than a log shipper would.
    let limits = BTreeMap::from([("cpu".to_string(), q("15m")), ("memory".into(), q("32Mi"))]);
    let requests = if guaranteed {
        limits.clone()
    } else {
        BTreeMap::from([("cpu".to_string(), q("5m")), ("memory".into(), q("4Mi"))])
    };
    Container {
        name: CONSOLE_LOG_CONTAINER.into(),
        image: Some(cfg.image.clone()),
        image_pull_policy: cfg.image_pull_policy.clone(),
        command: Some(vec![
            TAIL_BINARY.into(),
            "--lifeline".into(),
            LIFELINE.into(),
            CONSOLE_LOG_FILE.into(),
        ]),
        resources: Some(ResourceRequirements {
            requests: Some(requests),
            limits: Some(limits),
            ..ResourceRequirements::default()
        }),
        // Read and emptied once copied: not read-only.
        volume_mounts: Some(vec![
            VolumeMount {
                name: "console-log".into(),
                mount_path: CONSOLE_LOG_DIR.into(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "life".into(),
                mount_path: LIFE_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ]),
        security_context: Some(unprivileged()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Container::default()
    }
}

/// An image copier's resources: it copies once (files of any size: no CPU limit unless the
/// pod must be Guaranteed) and then sleeps in `cat`. Page cache is reclaimable, so the
/// memory limit does not bound what it copies.
fn copier_resources(guaranteed: bool) -> ResourceRequirements {
    let mut limits = BTreeMap::from([("memory".to_string(), q("64Mi"))]);
    let requests = if guaranteed {
        limits.insert("cpu".into(), q("100m"));
        limits.clone()
    } else {
        // A sleeping busybox `sh` and `cat` take about a MiB (KubeVirt requests 1M for its
        // container-disk containers).
        BTreeMap::from([("cpu".to_string(), q("10m")), ("memory".into(), q("4Mi"))])
    };
    ResourceRequirements {
        requests: Some(requests),
        limits: Some(limits),
        ..ResourceRequirements::default()
    }
}

/// Every container of a launcher pod: what Pod Security Standard `restricted` asks of a
/// container (no capabilities, no privilege escalation, non-root), and a read-only root.
/// A launcher-image container's security context: nothing beyond an ordinary user's
/// (virt-operator gives virt-handler's capabilities-probing init container the same).
pub fn unprivileged() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        ..SecurityContext::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}
