//! Volume hotplug on this node (issue 44): a hotplugged volume's claim is mounted on the
//! node by its attachment pod (made by virt-controller, `controllers/src/vmi/hotplug.rs`);
//! virt-handler mounts the claim's `disk.img` from that pod into the launcher pod
//! (`/var/run/kubevirt/hotplug-disks/<volume>.img`), asks the launcher to plug it into the
//! guest, and reports each step in the VMI's `status.volumeStatus` with KubeVirt's phases.
//! Removal runs the other way. Only this handler writes the hotplugged volumes' entries.
//!
//! **How the image crosses pods:** a mount made inside the launcher's mount namespace,
//! cloned from the attachment container's (`open_tree` + `move_mount`, in a short-lived
//! child process: entering a mount namespace needs a single-threaded process). Neither
//! pod gains a privilege or a host path, the mount holds the claim's file system for as
//! long as the guest uses it (a restarted attachment pod or handler does not take it
//! away: kubevirt/kubevirt#9263), and it goes with the launcher pod's namespace. The file
//! is opened in the attachment container's own view and must be a regular file with one
//! link (no symlink, no device node a tenant made), and is given to the launcher's user.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::hotplug::{
    ATTACHMENT_APP, ATTACHMENT_MOUNT_DIR, ATTACHMENT_VMI_UID_LABEL, ATTACHMENT_VOLUME_LABEL,
    HotplugVolumeStatus, LAUNCHER_HOTPLUG_DIR, launcher_image_path, phase,
};
use kubevirt_api::vmi::{VirtualMachineInstancePhase as Phase, VolumeStatus};
use kubevirt_api::{COMPONENT_LABEL, LAUNCHER_UID, VirtualMachineInstance};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use virt_domain::protocol::{Request, Response};
use virt_domain::schema::HotpluggedDisk;

use crate::launcher_fs::{Peer, container_pid};
use crate::network::KnownVmis;
use crate::vmis::Paths;
use crate::{ClientError, LauncherClient};

/// The attachment pod's annotation with the size of a `disk.img` to create
/// (virt-controller's `DISK_SIZE_ANNOTATION`).
pub const DISK_SIZE_ANNOTATION: &str = "kubevirt-rs.io/hotplug-disk-size";

/// The subcommand of `virt-handler` that mounts or unmounts one image (see [`helper_main`]).
pub const HELPER_SUBCOMMAND: &str = "hotplug-mount";

/// Errors of hotplug steps.
#[derive(Debug, thiserror::Error)]
pub enum HotplugError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The claim's image is not something a guest may be given.
    #[error("{0}")]
    Refused(String),
    /// The mount helper failed.
    #[error("mounting: {0}")]
    Helper(String),
    /// The launcher refused or did not answer.
    #[error("launcher: {0}")]
    Launcher(String),
    /// Reading /proc.
    #[error(transparent)]
    Fs(#[from] crate::launcher_fs::LauncherFsError),
}

fn sys(what: impl Into<String>) -> impl FnOnce(rustix::io::Errno) -> HotplugError {
    let what = what.into();
    move |e| HotplugError::Sys {
        what,
        source: e.into(),
    }
}

/// What the mount helper does, handed to it as its one JSON argument.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HelperOp {
    /// Mount the attachment container's image into the launcher container.
    Mount {
        /// The procfs root (`/proc`).
        proc: PathBuf,
        /// A process of the attachment container, and its pod.
        source_pid: u32,
        /// The attachment pod's uid.
        source_pod: String,
        /// The image, relative to the attachment container's root.
        source_path: String,
        /// Bytes of the image to create when the claim has none.
        create_size: Option<u64>,
        /// A process of the launcher container.
        target_pid: u32,
        /// The launcher pod's uid.
        target_pod: String,
        /// The mount point, relative to the launcher container's root.
        target_path: String,
    },
    /// Unmount it from the launcher container.
    Unmount {
        /// The procfs root (`/proc`).
        proc: PathBuf,
        /// A process of the launcher container.
        target_pid: u32,
        /// The launcher pod's uid.
        target_pod: String,
        /// The mount point, relative to the launcher container's root.
        target_path: String,
    },
}

/// A volume name usable in a path: a DNS label, as KubeVirt's volume names are. Checked
/// again here although the API validates names, since it becomes a path on the node.
pub fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Runs `op` in this process, which must be single-threaded (a fresh `virt-handler
/// hotplug-mount` process): it enters other mount namespaces.
pub fn helper_main(op: &HelperOp) -> Result<(), HotplugError> {
    use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
    let beneath = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match op {
        HelperOp::Mount {
            proc,
            source_pid,
            source_pod,
            source_path,
            create_size,
            target_pid,
            target_pod,
            target_path,
        } => {
            let src = Peer::of_pid(proc, *source_pid, Some(source_pod))?;
            let dst = Peer::of_pid(proc, *target_pid, Some(target_pod))?;
            let (src_ns, dst_ns, dst_root) = (src.mnt_ns()?, dst.mnt_ns()?, dst.root()?);
            // open_tree clones only a mount of the caller's own namespace.
            move_into_link_name_space(
                rustix::fd::AsFd::as_fd(&src_ns),
                Some(LinkNameSpaceType::Mount),
            )
            .map_err(sys("entering the attachment pod's mount namespace"))?;
            let root = rustix::fs::open(
                "/",
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(sys("opening the attachment container's root"))?;
            // openat2 refuses a mode without O_CREAT.
            let open = |flags: OFlags| {
                let mode = if flags.contains(OFlags::CREATE) {
                    Mode::from_raw_mode(0o660)
                } else {
                    Mode::empty()
                };
                rustix::fs::openat2(
                    &root,
                    source_path.as_str(),
                    flags | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    mode,
                    beneath,
                )
            };
            let file = match (open(OFlags::empty()), create_size) {
                (Ok(f), _) => f,
                (Err(rustix::io::Errno::NOENT), Some(size)) => {
                    let f = open(OFlags::CREATE | OFlags::EXCL)
                        .map_err(sys(format!("creating {source_path}")))?;
                    rustix::fs::ftruncate(&f, *size)
                        .map_err(sys(format!("sizing {source_path}")))?;
                    f
                }
                (Err(e), _) => return Err(sys(format!("opening {source_path}"))(e)),
            };
            let st = rustix::fs::fstat(&file).map_err(sys(format!("reading {source_path}")))?;
            if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile
                || st.st_nlink != 1
            {
                return Err(HotplugError::Refused(format!(
                    "{source_path} in the claim is not a regular file with one link"
                )));
            }
            // QEMU runs as the launcher's user; a claim written by another keeps its data.
            if st.st_uid != LAUNCHER_UID {
                rustix::fs::fchown(
                    &file,
                    Some(rustix::fs::Uid::from_raw(LAUNCHER_UID)),
                    Some(rustix::fs::Gid::from_raw(LAUNCHER_UID)),
                )
                .map_err(sys(format!("handing {source_path} to the launcher's user")))?;
            }
            use rustix::mount::{MoveMountFlags, OpenTreeFlags, move_mount, open_tree};
            let tree = open_tree(
                &file,
                "",
                OpenTreeFlags::OPEN_TREE_CLONE
                    | OpenTreeFlags::OPEN_TREE_CLOEXEC
                    | OpenTreeFlags::AT_EMPTY_PATH,
            )
            .map_err(sys("cloning the image's mount"))?;
            move_into_link_name_space(
                rustix::fd::AsFd::as_fd(&dst_ns),
                Some(LinkNameSpaceType::Mount),
            )
            .map_err(sys("entering the launcher pod's mount namespace"))?;
            // Symlinks resolved as the launcher sees them (its /var/run is one), never out
            // of its root; the mount point itself must not be one.
            let point = rustix::fs::openat2(
                &dst_root,
                target_path.as_str(),
                OFlags::CREATE | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
                ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
            )
            .map_err(sys(format!("making the mount point {target_path}")))?;
            move_mount(
                &tree,
                "",
                &point,
                "",
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
            )
            .map_err(sys(format!("mounting on {target_path}")))?;
            Ok(())
        }
        HelperOp::Unmount {
            proc,
            target_pid,
            target_pod,
            target_path,
        } => {
            let dst = Peer::of_pid(proc, *target_pid, Some(target_pod))?;
            let (dst_ns, dst_root) = (dst.mnt_ns()?, dst.root()?);
            move_into_link_name_space(
                rustix::fd::AsFd::as_fd(&dst_ns),
                Some(LinkNameSpaceType::Mount),
            )
            .map_err(sys("entering the launcher pod's mount namespace"))?;
            let abs = format!("/{target_path}");
            match rustix::mount::unmount(
                abs.as_str(),
                rustix::mount::UnmountFlags::DETACH | rustix::mount::UnmountFlags::NOFOLLOW,
            ) {
                Ok(()) | Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(sys(format!("unmounting {target_path}"))(e)),
            }
            match rustix::fs::unlinkat(
                &dst_root,
                target_path.as_str(),
                rustix::fs::AtFlags::empty(),
            ) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
                Err(e) => Err(sys(format!("removing {target_path}"))(e)),
            }
        }
    }
}

/// Runs [`helper_main`] for `op` in a child process of this binary.
async fn run_helper(op: &HelperOp) -> Result<(), HotplugError> {
    let json = serde_json::to_string(op).map_err(|e| HotplugError::Helper(e.to_string()))?;
    let out = tokio::process::Command::new("/proc/self/exe")
        .arg(HELPER_SUBCOMMAND)
        .arg(json)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| HotplugError::Helper(e.to_string()))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(HotplugError::Helper(
        err.lines().last().unwrap_or("failed").trim().to_string(),
    ))
}

/// Whether `path` is among the mount points `points` (mountinfo shows them resolved: a
/// path under `/var/run` appears under `/run`, the symlink's target in the launcher image).
fn mounted_at(points: &BTreeSet<String>, path: &str) -> bool {
    points.contains(path)
        || path
            .strip_prefix("/var/run/")
            .is_some_and(|rest| points.contains(&format!("/run/{rest}")))
}

/// The image's mount point in the launcher container, relative to its root.
fn target_path(volume: &str) -> String {
    launcher_image_path(volume)
        .trim_start_matches('/')
        .to_string()
}

/// One volume's step, decided from what is seen now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Wait for the attachment pod to run here.
    AwaitPod,
    /// Mount the image from the attachment pod into the launcher.
    Mount,
    /// Ask the launcher to plug it in.
    Attach,
    /// It is in the guest.
    Done,
    /// Unplug it from the guest.
    Detach,
    /// Unmount it from the launcher pod, then forget it.
    Unmount,
}

/// What to do for each volume, from the volumes the spec hotplugs (`wanted`), those whose
/// attachment pod runs on this node (`pods`), those mounted into the launcher (`mounted`)
/// and those the guest has (`attached`). Volumes neither wanted nor anywhere are absent.
pub fn steps(
    wanted: &BTreeSet<String>,
    pods: &BTreeSet<String>,
    mounted: &BTreeSet<String>,
    attached: &BTreeSet<String>,
) -> BTreeMap<String, Step> {
    let mut out = BTreeMap::new();
    for v in wanted {
        let step = if attached.contains(v) {
            Step::Done
        } else if mounted.contains(v) {
            Step::Attach
        } else if pods.contains(v) {
            Step::Mount
        } else {
            Step::AwaitPod
        };
        out.insert(v.clone(), step);
    }
    for v in attached.difference(wanted) {
        out.insert(v.clone(), Step::Detach);
    }
    for v in mounted.difference(wanted) {
        out.entry(v.clone()).or_insert(Step::Unmount);
    }
    out
}

/// The phase, reason and message a volume at `step` is reported with.
fn phase_of(step: &Step) -> (&'static str, &'static str, &'static str) {
    match step {
        Step::AwaitPod => (
            phase::PENDING,
            "AttachmentPodPending",
            "waiting for the attachment pod to run on the VMI's node",
        ),
        Step::Mount => (
            phase::ATTACHED_TO_NODE,
            "VolumeAttachedToNode",
            "the attachment pod has the claim on the node",
        ),
        Step::Attach => (
            phase::MOUNTED_TO_POD,
            "VolumeMountedToPod",
            "the image is mounted into the launcher pod",
        ),
        Step::Done => (phase::READY, "VolumeReady", "the guest has the disk"),
        Step::Detach | Step::Unmount => (
            phase::DETACHING,
            "VolumeDetaching",
            "being removed from the guest and the node",
        ),
    }
}

/// `status.volumeStatus` with this handler's entries for the volumes of `steps` (their
/// attachment pods `pods`, the guest's devices `attached`, an error per volume), the
/// others kept as they are; a volume gone everywhere has no entry.
pub fn volume_status(
    prev: &[VolumeStatus],
    steps: &BTreeMap<String, Step>,
    pods: &BTreeMap<String, (String, String)>,
    attached: &[HotpluggedDisk],
    errors: &BTreeMap<String, String>,
) -> Vec<VolumeStatus> {
    let mut out: Vec<VolumeStatus> = prev
        .iter()
        .filter(|s| !steps.contains_key(&s.name) && s.hotplug_volume.is_none())
        .cloned()
        .collect();
    for (name, step) in steps {
        let base = prev
            .iter()
            .find(|s| &s.name == name)
            .cloned()
            .unwrap_or_else(|| VolumeStatus {
                name: name.clone(),
                ..VolumeStatus::default()
            });
        let (phase, reason, message) = phase_of(step);
        let (pod_name, pod_uid) = pods.get(name).cloned().unzip();
        out.push(VolumeStatus {
            target: attached
                .iter()
                .find(|a| &a.name == name)
                .map(|a| a.target.clone())
                .or(base.target.clone()),
            phase: Some(phase.into()),
            reason: Some(if errors.contains_key(name) {
                "HotplugFailed".into()
            } else {
                reason.into()
            }),
            message: Some(errors.get(name).cloned().unwrap_or_else(|| message.into())),
            hotplug_volume: Some(HotplugVolumeStatus {
                attach_pod_name: pod_name,
                attach_pod_uid: pod_uid,
            }),
            ..base
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Hotplugs volumes of this node's VMIs until `shutdown`: looks at every VMI with
/// hotplugged volumes (or entries for them) each second and when its attachment pods
/// change.
pub async fn run(
    client: Client,
    node: String,
    paths: Paths,
    vmis: KnownVmis,
    shutdown: CancellationToken,
) {
    let Paths::Pods { proc } = paths.clone() else {
        // Launchers beside the handler (tests) have no pods to attach claims with.
        return;
    };
    let pods: Api<Pod> = Api::all(client.clone());
    let (store, writer) = reflector::store();
    let cfg = watcher::Config::default()
        .labels(&format!("{COMPONENT_LABEL}={ATTACHMENT_APP}"))
        .fields(&format!("spec.nodeName={node}"));
    let events = reflector::reflector(writer, watcher::watcher(pods, cfg).default_backoff())
        .touched_objects();
    tokio::pin!(events);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            ev = events.next() => {
                if ev.is_none() {
                    return;
                }
            }
        }
        for vmi in vmis.all() {
            if !interested(&vmi) {
                continue;
            }
            if let Err(e) = sync(&client, &proc, &node, &paths, &store, &vmi).await {
                tracing::warn!(ns = ?vmi.namespace(), name = %vmi.name_any(), error = %e, "hotplug");
            }
        }
    }
}

/// Whether `vmi` hotplugs anything or did.
fn interested(vmi: &VirtualMachineInstance) -> bool {
    !kubevirt_api::hotplug::hotplugged(&vmi.spec).is_empty()
        || vmi
            .status
            .as_ref()
            .and_then(|s| s.volume_status.as_ref())
            .is_some_and(|v| v.iter().any(|s| s.hotplug_volume.is_some()))
}

/// Brings one running VMI's hotplugged volumes one step on each and writes their status.
async fn sync(
    client: &Client,
    proc: &Path,
    node: &str,
    paths: &Paths,
    store: &Store<Pod>,
    vmi: &VirtualMachineInstance,
) -> Result<(), HotplugError> {
    let (Some(uid), Some(ns)) = (vmi.uid(), vmi.namespace()) else {
        return Ok(());
    };
    let Some(st) = vmi.status.as_ref() else {
        return Ok(());
    };
    if st.phase != Phase::Running || st.node_name.as_deref() != Some(node) {
        return Ok(());
    }
    let Some(launcher_pod) = paths.launcher_key(&uid, vmi, node) else {
        return Ok(());
    };
    let launcher = LauncherClient::new(paths.launcher(&launcher_pod));
    let attached = match launcher.call(&Request::GetStatus).await {
        Ok(Response::Status(s)) => s.hotplugged,
        Ok(other) => return Err(HotplugError::Launcher(format!("{other:?}"))),
        Err(e) => return Err(HotplugError::Launcher(e.to_string())),
    };
    let specs: BTreeMap<String, _> = kubevirt_api::hotplug::hotplugged(&vmi.spec)
        .into_iter()
        .map(|(v, d)| (v.name.clone(), (v.clone(), d.clone())))
        .collect();
    let wanted: BTreeSet<String> = specs.keys().filter(|n| safe_name(n)).cloned().collect();
    // This VMI's attachment pods running here, by volume (name, uid, disk size).
    let mut pods: BTreeMap<String, (String, String, Option<u64>)> = BTreeMap::new();
    for p in store.state() {
        let labels = p.labels();
        if p.namespace().as_deref() != Some(ns.as_str())
            || labels.get(ATTACHMENT_VMI_UID_LABEL) != Some(&uid)
            || p.metadata.deletion_timestamp.is_some()
            || p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running")
            // Only the controller's: owned by this VMI's launcher pod.
            || !p.owner_references().iter().any(|o| o.uid == launcher_pod)
        {
            continue;
        }
        let (Some(volume), Some(pod_uid)) = (labels.get(ATTACHMENT_VOLUME_LABEL), p.uid()) else {
            continue;
        };
        let size = p
            .annotations()
            .get(DISK_SIZE_ANNOTATION)
            .and_then(|s| s.parse().ok());
        pods.insert(volume.clone(), (p.name_any(), pod_uid, size));
    }
    let pod_names: BTreeMap<String, (String, String)> = pods
        .iter()
        .map(|(v, (n, u, _))| (v.clone(), (n.clone(), u.clone())))
        .collect();
    let attached_names: BTreeSet<String> = attached.iter().map(|a| a.name.clone()).collect();
    let prev = st.volume_status.clone().unwrap_or_default();
    // The steady state (every wanted volume in the guest, nothing else, the status says
    // so) costs one launcher call: no walk of /proc, no mountinfo.
    let settled = steps(
        &wanted,
        &pod_names.keys().cloned().collect(),
        &attached_names,
        &attached_names,
    );
    if settled.values().all(|s| *s == Step::Done)
        && volume_status(&prev, &settled, &pod_names, &attached, &BTreeMap::new()) == prev
    {
        return Ok(());
    }
    let launcher_pid = {
        let (proc, pod) = (proc.to_path_buf(), launcher_pod.clone());
        tokio::task::spawn_blocking(move || {
            container_pid(&proc, &pod, LAUNCHER_HOTPLUG_DIR.trim_start_matches('/'))
        })
        .await
        .ok()
        .flatten()
    };
    let Some(launcher_pid) = launcher_pid else {
        return Err(HotplugError::Launcher(
            "the launcher's container is not found on this node".into(),
        ));
    };
    let points: BTreeSet<String> = Peer::of_pid(proc, launcher_pid, Some(&launcher_pod))?
        .mount_points()?
        .into_iter()
        .collect();
    let mounted: BTreeSet<String> = specs
        .keys()
        .chain(
            st.volume_status
                .iter()
                .flatten()
                .filter(|s| s.hotplug_volume.is_some())
                .map(|s| &s.name),
        )
        .filter(|n| safe_name(n) && mounted_at(&points, &launcher_image_path(n)))
        .cloned()
        .collect();
    let plan = steps(
        &wanted,
        &pods.keys().cloned().collect(),
        &mounted,
        &attached_names,
    );
    let mut errors = BTreeMap::new();
    let mut now_attached = attached.clone();
    let mut done = plan.clone();
    for (volume, step) in &plan {
        let result: Result<Option<Step>, HotplugError> = async {
            match step {
                Step::Mount => {
                    let (_, pod_uid, size) = &pods[volume];
                    let source_dir =
                        format!("{}/{volume}", ATTACHMENT_MOUNT_DIR.trim_start_matches('/'));
                    let source_pid = {
                        let (proc, pod, dir) =
                            (proc.to_path_buf(), pod_uid.clone(), source_dir.clone());
                        tokio::task::spawn_blocking(move || container_pid(&proc, &pod, &dir))
                            .await
                            .ok()
                            .flatten()
                    }
                    .ok_or_else(|| {
                        HotplugError::Helper("the attachment pod's container is not found".into())
                    })?;
                    run_helper(&HelperOp::Mount {
                        proc: proc.to_path_buf(),
                        source_pid,
                        source_pod: pod_uid.clone(),
                        source_path: format!("{source_dir}/disk.img"),
                        create_size: *size,
                        target_pid: launcher_pid,
                        target_pod: launcher_pod.clone(),
                        target_path: target_path(volume),
                    })
                    .await?;
                    tracing::info!(%volume, "hotplugged volume mounted into the launcher pod");
                    attach(&launcher, &specs[volume], &mut now_attached).await
                }
                Step::Attach => attach(&launcher, &specs[volume], &mut now_attached).await,
                Step::Detach => {
                    let r = launcher
                        .call(&Request::DetachVolume {
                            name: volume.clone(),
                        })
                        .await;
                    now_attached = hotplugged(r)?;
                    if now_attached.iter().any(|a| &a.name == volume) {
                        return Ok(Some(Step::Detach));
                    }
                    unmount(proc, launcher_pid, &launcher_pod, volume).await?;
                    Ok(None)
                }
                Step::Unmount => {
                    unmount(proc, launcher_pid, &launcher_pod, volume).await?;
                    Ok(None)
                }
                Step::AwaitPod | Step::Done => Ok(Some(step.clone())),
            }
        }
        .await;
        match result {
            Ok(Some(s)) => {
                done.insert(volume.clone(), s);
            }
            Ok(None) => {
                done.remove(volume);
            }
            Err(e) => {
                tracing::warn!(%volume, error = %e, "hotplug step failed");
                errors.insert(volume.clone(), e.to_string());
            }
        }
    }
    // A volume unplugged from the guest and unmounted has no entry any more.
    let next = volume_status(&prev, &done, &pod_names, &now_attached, &errors);
    if next == prev {
        return Ok(());
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": vmi.resource_version()},
        "status": {"volumeStatus": next},
    });
    let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &ns);
    match api
        .patch_status(
            &vmi.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // A newer VMI comes with the watch; the next round starts from it.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        Err(e) => Err(HotplugError::Launcher(format!(
            "writing the VMI status: {e}"
        ))),
    }
}

/// Asks the launcher to plug `volume` in; the step it is at afterwards.
async fn attach(
    launcher: &LauncherClient,
    (volume, disk): &(kubevirt_api::vmi::Volume, kubevirt_api::vmi::Disk),
    now: &mut Vec<HotpluggedDisk>,
) -> Result<Option<Step>, HotplugError> {
    let r = launcher
        .call(&Request::AttachVolume {
            disk: Box::new(disk.clone()),
            volume: Box::new(volume.clone()),
        })
        .await;
    *now = hotplugged(r)?;
    Ok(Some(if now.iter().any(|a| a.name == volume.name) {
        tracing::info!(volume = %volume.name, "hotplugged volume is in the guest");
        Step::Done
    } else {
        Step::Attach
    }))
}

fn hotplugged(r: Result<Response, ClientError>) -> Result<Vec<HotpluggedDisk>, HotplugError> {
    match r {
        Ok(Response::Hotplugged { disks }) => Ok(disks),
        Ok(Response::Error { message }) => Err(HotplugError::Launcher(message)),
        Ok(other) => Err(HotplugError::Launcher(format!(
            "unexpected answer {other:?}"
        ))),
        Err(e) => Err(HotplugError::Launcher(e.to_string())),
    }
}

async fn unmount(
    proc: &Path,
    launcher_pid: u32,
    launcher_pod: &str,
    volume: &str,
) -> Result<(), HotplugError> {
    run_helper(&HelperOp::Unmount {
        proc: proc.to_path_buf(),
        target_pid: launcher_pid,
        target_pod: launcher_pod.to_string(),
        target_path: target_path(volume),
    })
    .await?;
    tracing::info!(%volume, "hotplugged volume unmounted from the launcher pod");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_volume_goes_one_step_at_a_time_and_away_in_reverse() {
        let s = steps(
            &set(&["a", "b", "c", "d"]),
            &set(&["b", "c", "d"]),
            &set(&["c", "d"]),
            &set(&["d", "x"]),
        );
        assert_eq!(s["a"], Step::AwaitPod);
        assert_eq!(s["b"], Step::Mount);
        assert_eq!(s["c"], Step::Attach);
        assert_eq!(s["d"], Step::Done);
        assert_eq!(s["x"], Step::Detach);
        let s = steps(&set(&[]), &set(&["y"]), &set(&["y"]), &set(&[]));
        assert_eq!(s["y"], Step::Unmount);
        assert!(steps(&set(&[]), &set(&["z"]), &set(&[]), &set(&[])).is_empty());
    }

    #[test]
    fn status_entries_follow_the_steps_and_keep_other_volumes() {
        let prev: Vec<VolumeStatus> = serde_json::from_value(serde_json::json!([
            {"name": "root", "phase": "Ready"},
            {"name": "data", "persistentVolumeClaimInfo": {"claimName": "data-pvc"}},
            {"name": "gone", "phase": "Detaching", "hotplugVolume": {}}
        ]))
        .unwrap();
        let steps = BTreeMap::from([("data".to_string(), Step::Done)]);
        let pods = BTreeMap::from([(
            "data".to_string(),
            ("hp-volume-x".to_string(), "u1".to_string()),
        )]);
        let attached = [HotpluggedDisk {
            name: "data".into(),
            target: "sda".into(),
        }];
        let next = volume_status(&prev, &steps, &pods, &attached, &BTreeMap::new());
        let names: Vec<&str> = next.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["data", "root"]);
        let data = &next[0];
        assert_eq!(data.phase.as_deref(), Some("Ready"));
        assert_eq!(data.target.as_deref(), Some("sda"));
        assert!(data.persistent_volume_claim_info.is_some());
        assert_eq!(
            data.hotplug_volume
                .as_ref()
                .unwrap()
                .attach_pod_name
                .as_deref(),
            Some("hp-volume-x")
        );
        let errors = BTreeMap::from([("data".to_string(), "boom".to_string())]);
        let failed = volume_status(
            &prev,
            &BTreeMap::from([("data".to_string(), Step::Mount)]),
            &pods,
            &[],
            &errors,
        );
        assert_eq!(failed[0].reason.as_deref(), Some("HotplugFailed"));
        assert_eq!(failed[0].message.as_deref(), Some("boom"));
    }

    #[test]
    fn a_mount_under_var_run_is_seen_under_run() {
        let points = set(&["/", "/run/kubevirt/hotplug-disks/a.img"]);
        assert!(mounted_at(&points, "/var/run/kubevirt/hotplug-disks/a.img"));
        assert!(!mounted_at(
            &points,
            "/var/run/kubevirt/hotplug-disks/b.img"
        ));
    }

    #[test]
    fn only_dns_labels_become_paths() {
        assert!(safe_name("data-1"));
        for bad in ["", "../x", "a/b", "A", "-a", "a-", "a.b"] {
            assert!(!safe_name(bad), "{bad}");
        }
    }
}
