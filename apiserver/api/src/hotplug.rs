//! Volume hotplug (issue 44): KubeVirt's `AddVolumeOptions`/`RemoveVolumeOptions` (the body of
//! the `addvolume`/`removevolume` subresources of a VM and a VMI), a VM's pending
//! `status.volumeRequests`, a hotplugged volume's status, and the pure functions that apply a
//! request to a spec. virt-apiserver checks and applies requests with these, virt-controller
//! applies a VM's queued requests with the same, so both agree on what a request means.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::vmi::{
    DataVolumeSource, Disk, PersistentVolumeClaimVolumeSource, VirtualMachineInstanceSpec, Volume,
};

/// The feature gates that enable the hotplug subresources (either one, as in KubeVirt).
pub const FEATURE_GATES: [&str; 2] = ["HotplugVolumes", "DeclarativeHotplugVolumes"];

/// Where virt-handler mounts a hotplugged volume's image inside the launcher pod, one file
/// per volume (`<dir>/<volume>.img`), as KubeVirt's `hotplug-disks` directory.
pub const LAUNCHER_HOTPLUG_DIR: &str = "/var/run/kubevirt/hotplug-disks";

/// Where an attachment pod mounts its claim (`<dir>/<volume>`), read by virt-handler through
/// the pod's mount namespace.
pub const ATTACHMENT_MOUNT_DIR: &str = "/hp";

/// Label on an attachment pod naming the VMI it serves (by uid).
pub const ATTACHMENT_VMI_UID_LABEL: &str = "kubevirt.io/hotplug-vmi-uid";
/// Label on an attachment pod naming the volume it attaches.
pub const ATTACHMENT_VOLUME_LABEL: &str = "kubevirt.io/hotplug-volume";
/// `kubevirt.io` label value of an attachment pod (KubeVirt's `hotplug-disk`).
pub const ATTACHMENT_APP: &str = "hotplug-disk";

/// The file a hotplugged volume's image is at in the launcher pod.
pub fn launcher_image_path(volume: &str) -> String {
    format!("{LAUNCHER_HOTPLUG_DIR}/{volume}.img")
}

/// Annotation on a VMI naming (comma-separated) the volumes hotplugged into the VMI alone
/// (its `addvolume`, virtctl without `--persist`): virt-controller keeps a VM's running VMI
/// in line with the VM's template but leaves these alone, so that they stay until the VMI
/// stops or their `removevolume`, as in KubeVirt.
pub const EPHEMERAL_ANNOTATION: &str = "kubevirt.io/ephemeral-hotplug-volumes";

/// The volume names of an [`EPHEMERAL_ANNOTATION`] value.
pub fn ephemeral_names(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect()
}

/// The [`EPHEMERAL_ANNOTATION`] value after `request` applied to a VMI alone (`None`: no
/// volume left, the annotation goes).
pub fn ephemeral_after(
    value: Option<&str>,
    request: &VirtualMachineVolumeRequest,
) -> Option<String> {
    let mut names = ephemeral_names(value);
    if let Some(a) = &request.add_volume_options {
        if !names.contains(&a.name) {
            names.push(a.name.clone());
        }
    } else if let Some(r) = &request.remove_volume_options {
        names.retain(|n| *n != r.name);
    }
    (!names.is_empty()).then(|| names.join(","))
}

/// The source of a hotplugged volume: a claim or a DataVolume.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotplugVolumeSource {
    /// A PersistentVolumeClaim.
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    /// A CDI DataVolume (its claim has the same name).
    pub data_volume: Option<DataVolumeSource>,
}

impl HotplugVolumeSource {
    /// The claim (or DataVolume, whose claim has its name) behind the volume.
    pub fn claim_name(&self) -> Option<&str> {
        self.persistent_volume_claim
            .as_ref()
            .map(|p| p.claim_name.as_str())
            .or(self.data_volume.as_ref().map(|d| d.name.as_str()))
    }
}

/// Body of `addvolume`.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddVolumeOptions {
    /// Name of the volume and its disk.
    #[serde(default)]
    pub name: String,
    /// The disk the guest sees.
    pub disk: Option<Disk>,
    /// Where the volume comes from.
    pub volume_source: Option<HotplugVolumeSource>,
    /// `["All"]` to check without changing anything.
    pub dry_run: Option<Vec<String>>,
}

/// Body of `removevolume`.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoveVolumeOptions {
    /// Name of the volume to remove.
    #[serde(default)]
    pub name: String,
    /// `["All"]` to check without changing anything.
    pub dry_run: Option<Vec<String>>,
}

/// A VM's pending add or remove (`status.volumeRequests[]`).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineVolumeRequest {
    /// Add a volume.
    pub add_volume_options: Option<AddVolumeOptions>,
    /// Remove a volume.
    pub remove_volume_options: Option<RemoveVolumeOptions>,
}

/// The hotplug part of a volume's status.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotplugVolumeStatus {
    /// The pod that attaches the claim to the VMI's node.
    pub attach_pod_name: Option<String>,
    /// Its uid.
    #[serde(rename = "attachPodUID")]
    pub attach_pod_uid: Option<String>,
}

/// KubeVirt's volume phases of a hotplugged volume, in the order they are reached.
pub mod phase {
    /// Waiting for the attachment pod (or its claim).
    pub const PENDING: &str = "Pending";
    /// The claim is bound.
    pub const BOUND: &str = "Bound";
    /// The attachment pod runs on the VMI's node with the claim mounted.
    pub const ATTACHED_TO_NODE: &str = "AttachedToNode";
    /// The image is mounted into the launcher pod.
    pub const MOUNTED_TO_POD: &str = "MountedToPod";
    /// The guest has the disk.
    pub const READY: &str = "Ready";
    /// Being removed from the guest and the node.
    pub const DETACHING: &str = "Detaching";
}

/// Why a volume request cannot apply to a spec (a 409 naming the volume, as KubeVirt).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// `name` is required.
    #[error("AddVolumeOptions requires name to be set")]
    AddNoName,
    /// `disk` is required.
    #[error("AddVolumeOptions requires disk to not be nil")]
    NoDisk,
    /// `volumeSource` is required, with a claim or DataVolume.
    #[error("AddVolumeOptions requires VolumeSource to not be nil")]
    NoSource,
    /// `name` is required.
    #[error("RemoveVolumeOptions requires name to be set")]
    RemoveNoName,
    /// The request is neither an add nor a remove.
    #[error("a volume request needs addVolumeOptions or removeVolumeOptions")]
    Empty,
    /// A volume of that name exists.
    #[error("Unable to add volume [{0}] because volume with that name already exists")]
    NameExists(String),
    /// A volume uses that claim already.
    #[error("Unable to add volume source [{0}] because it already exists")]
    SourceExists(String),
    /// The volume was part of the VM from its start.
    #[error("Unable to remove volume [{0}] because it is not hotpluggable")]
    NotHotpluggable(String),
    /// No such volume.
    #[error("Unable to remove volume [{0}] because it does not exist")]
    NotFound(String),
    /// The disk's bus cannot be hotplugged.
    #[error("Unable to add volume [{0}]: bus {1} cannot be hotplugged, use scsi or virtio")]
    Bus(String, String),
    /// A hotplugged disk cannot be a CD-ROM or boot the guest.
    #[error(
        "Unable to add volume [{0}]: a hotplugged disk is a disk or a lun and has no bootOrder"
    )]
    DiskKind(String),
    /// The VM has a pending add of that volume.
    #[error("add volume request for volume [{0}] already exists")]
    AddPending(String),
    /// The VM has a pending remove of that volume, which an add must wait for.
    #[error(
        "unable to add volume since a remove volume request for volume [{0}] already exists and is still being processed"
    )]
    RemovePendingBlocksAdd(String),
    /// The VM has a pending remove of that volume.
    #[error("a remove volume request for volume [{0}] already exists and is still being processed")]
    RemovePending(String),
}

impl AddVolumeOptions {
    /// The request in KubeVirt's normal form: the disk named after the volume and the source
    /// marked hotpluggable; refuses a request missing a part.
    pub fn normalized(&self) -> Result<AddVolumeOptions, RequestError> {
        if self.name.is_empty() {
            return Err(RequestError::AddNoName);
        }
        let mut disk = self.disk.clone().ok_or(RequestError::NoDisk)?;
        let mut source = self.volume_source.clone().ok_or(RequestError::NoSource)?;
        if source.claim_name().is_none_or(str::is_empty) {
            return Err(RequestError::NoSource);
        }
        disk.name = self.name.clone();
        if disk.cdrom.is_some() || disk.boot_order.is_some() {
            return Err(RequestError::DiskKind(self.name.clone()));
        }
        let bus = disk
            .disk
            .as_ref()
            .and_then(|d| d.bus)
            .or(disk.lun.as_ref().and_then(|l| l.bus));
        if let Some(bus) = bus {
            let b = serde_json::to_value(bus)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            if b != "scsi" && b != "virtio" {
                return Err(RequestError::Bus(self.name.clone(), b));
            }
        }
        if let Some(p) = source.persistent_volume_claim.as_mut() {
            p.hotpluggable = Some(true);
        }
        if let Some(d) = source.data_volume.as_mut() {
            d.hotpluggable = Some(true);
        }
        Ok(AddVolumeOptions {
            name: self.name.clone(),
            disk: Some(disk),
            volume_source: Some(source),
            dry_run: self.dry_run.clone(),
        })
    }
}

impl VirtualMachineVolumeRequest {
    /// The volume the request is about.
    pub fn volume_name(&self) -> Option<&str> {
        self.add_volume_options
            .as_ref()
            .map(|a| a.name.as_str())
            .or(self.remove_volume_options.as_ref().map(|r| r.name.as_str()))
    }
}

/// The claim behind a VMI volume, for a claim or DataVolume volume.
fn volume_claim(v: &Volume) -> Option<&str> {
    v.persistent_volume_claim
        .as_ref()
        .map(|p| p.claim_name.as_str())
        .or(v.data_volume.as_ref().map(|d| d.name.as_str()))
}

/// Whether a volume was hotplugged (its claim or DataVolume is marked `hotpluggable`).
pub fn is_hotpluggable(v: &Volume) -> bool {
    v.persistent_volume_claim
        .as_ref()
        .is_some_and(|p| p.hotpluggable == Some(true))
        || v.data_volume
            .as_ref()
            .is_some_and(|d| d.hotpluggable == Some(true))
}

/// Checks that `request` applies to a spec with these volumes, as KubeVirt does: an added
/// volume's name and claim are new, a removed volume exists and was hotplugged.
pub fn verify(
    volumes: &[Volume],
    request: &VirtualMachineVolumeRequest,
) -> Result<(), RequestError> {
    if let Some(add) = &request.add_volume_options {
        let add = add.normalized()?;
        let claim = add
            .volume_source
            .as_ref()
            .and_then(|s| s.claim_name())
            .unwrap_or_default();
        for v in volumes {
            if v.name == add.name {
                return Err(RequestError::NameExists(add.name));
            }
            if volume_claim(v) == Some(claim) {
                return Err(RequestError::SourceExists(claim.to_string()));
            }
        }
        return Ok(());
    }
    let Some(remove) = &request.remove_volume_options else {
        return Err(RequestError::Empty);
    };
    if remove.name.is_empty() {
        return Err(RequestError::RemoveNoName);
    }
    match volumes
        .iter()
        .find(|v| v.name == remove.name || volume_claim(v) == Some(remove.name.as_str()))
    {
        None => Err(RequestError::NotFound(remove.name.clone())),
        Some(v) if !is_hotpluggable(v) => Err(RequestError::NotHotpluggable(v.name.clone())),
        Some(_) => Ok(()),
    }
}

/// `spec` with `request` applied: an added volume and its disk appended, a removed one (by
/// volume or claim name) dropped with its disk. Idempotent: applying an add whose volume is
/// there, or a remove whose volume is gone, changes nothing.
pub fn apply(
    spec: &VirtualMachineInstanceSpec,
    request: &VirtualMachineVolumeRequest,
) -> Result<VirtualMachineInstanceSpec, RequestError> {
    let mut out = spec.clone();
    if let Some(add) = &request.add_volume_options {
        let add = add.normalized()?;
        if out.volumes.iter().flatten().any(|v| v.name == add.name) {
            return Ok(out);
        }
        let source = add.volume_source.unwrap_or_default();
        let mut volume = Volume {
            name: add.name.clone(),
            ..Volume::default()
        };
        match (source.persistent_volume_claim, source.data_volume) {
            (Some(p), _) => volume.persistent_volume_claim = Some(p),
            (None, Some(d)) => volume.data_volume = Some(d),
            (None, None) => return Err(RequestError::NoSource),
        }
        out.volumes.get_or_insert_with(Vec::new).push(volume);
        let disks = out.domain.devices.disks.get_or_insert_with(Vec::new);
        if !disks.iter().any(|d| d.name == add.name) {
            disks.push(add.disk.unwrap_or_default());
        }
        return Ok(out);
    }
    let Some(remove) = &request.remove_volume_options else {
        return Err(RequestError::Empty);
    };
    let names: Vec<String> = out
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.name == remove.name || volume_claim(v) == Some(remove.name.as_str()))
        .map(|v| v.name.clone())
        .collect();
    if let Some(v) = out.volumes.as_mut() {
        v.retain(|v| !names.contains(&v.name));
    }
    if let Some(d) = out.domain.devices.disks.as_mut() {
        d.retain(|d| !names.contains(&d.name));
    }
    Ok(out)
}

/// A VM's pending requests (`status.volumeRequests`) with `request` queued, as KubeVirt's
/// virt-api queues it: an add refused while an add or a remove of that volume is pending; a
/// remove refused while a remove is pending, and it cancels a pending add of the volume.
pub fn queue(
    pending: &[VirtualMachineVolumeRequest],
    request: &VirtualMachineVolumeRequest,
) -> Result<Vec<VirtualMachineVolumeRequest>, RequestError> {
    let adds = |r: &VirtualMachineVolumeRequest, name: &str| {
        r.add_volume_options
            .as_ref()
            .is_some_and(|a| a.name == name)
    };
    let removes = |r: &VirtualMachineVolumeRequest, name: &str| {
        r.remove_volume_options
            .as_ref()
            .is_some_and(|a| a.name == name)
    };
    let mut out = Vec::with_capacity(pending.len() + 1);
    if let Some(add) = &request.add_volume_options {
        for r in pending {
            if adds(r, &add.name) {
                return Err(RequestError::AddPending(add.name.clone()));
            }
            if removes(r, &add.name) {
                return Err(RequestError::RemovePendingBlocksAdd(add.name.clone()));
            }
        }
        out.extend(pending.iter().cloned());
    } else if let Some(remove) = &request.remove_volume_options {
        for r in pending {
            if removes(r, &remove.name) {
                return Err(RequestError::RemovePending(remove.name.clone()));
            }
            if !adds(r, &remove.name) {
                out.push(r.clone());
            }
        }
    } else {
        return Err(RequestError::Empty);
    }
    out.push(request.clone());
    Ok(out)
}

/// `spec` without its hotplugged volumes and their disks (an emptied list is dropped): what
/// of a VM's template must not change for its running VMI to stay as it started, since
/// hotplugged volumes reach the VMI live.
pub fn without_hotplugged(spec: &VirtualMachineInstanceSpec) -> VirtualMachineInstanceSpec {
    let names: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| is_hotpluggable(v))
        .map(|v| v.name.as_str())
        .collect();
    let mut out = spec.clone();
    if let Some(v) = out.volumes.as_mut() {
        v.retain(|v| !names.contains(&v.name.as_str()));
    }
    if let Some(d) = out.domain.devices.disks.as_mut() {
        d.retain(|d| !names.contains(&d.name.as_str()));
    }
    if out.volumes.as_ref().is_some_and(Vec::is_empty) {
        out.volumes = None;
    }
    if out.domain.devices.disks.as_ref().is_some_and(Vec::is_empty) {
        out.domain.devices.disks = None;
    }
    out
}

/// [`without_hotplugged`] on a spec as JSON (the input policy compares specs as stored);
/// an empty `volumes` or `disks` list is dropped as well.
pub fn strip_hotplugged_json(spec: &mut serde_json::Value) {
    use serde_json::Value;
    let hot = |v: &Value| {
        [
            "/persistentVolumeClaim/hotpluggable",
            "/dataVolume/hotpluggable",
        ]
        .iter()
        .any(|p| v.pointer(p) == Some(&Value::Bool(true)))
    };
    let names: Vec<Value> = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| hot(v))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    // Emptied lists go, and so do empty ones: `volumes: []` and none are the same spec.
    let keep = |v: &Value| !v.get("name").is_some_and(|n| names.contains(n));
    let prune = |parent: Option<&mut serde_json::Map<String, Value>>, key: &str| {
        if let Some(o) = parent
            && let Some(Value::Array(a)) = o.get_mut(key)
        {
            a.retain(keep);
            if a.is_empty() {
                o.remove(key);
            }
        }
    };
    prune(spec.as_object_mut(), "volumes");
    prune(
        spec.pointer_mut("/domain/devices")
            .and_then(Value::as_object_mut),
        "disks",
    );
}

/// A running VMI's spec with its hotplugged volumes brought in line with its VM's template,
/// as KubeVirt's VM controller does: a hotplugged volume (with its disk) of the template
/// that the VMI lacks is added, a hotplugged volume of the VMI that the template no longer
/// has is removed with its disk, unless it was hotplugged into the VMI alone (`ephemeral`,
/// [`EPHEMERAL_ANNOTATION`]); no other volume is touched.
pub fn sync_hotplugged(
    vmi: &VirtualMachineInstanceSpec,
    template: &VirtualMachineInstanceSpec,
    ephemeral: &[String],
) -> VirtualMachineInstanceSpec {
    let mut out = vmi.clone();
    let in_template = |name: &str| hotplugged(template).iter().any(|(v, _)| v.name == name);
    let gone: Vec<String> = vmi
        .volumes
        .iter()
        .flatten()
        .filter(|v| is_hotpluggable(v) && !in_template(&v.name) && !ephemeral.contains(&v.name))
        .map(|v| v.name.clone())
        .collect();
    if let Some(v) = out.volumes.as_mut() {
        v.retain(|v| !gone.contains(&v.name));
    }
    if let Some(d) = out.domain.devices.disks.as_mut() {
        d.retain(|d| !gone.contains(&d.name));
    }
    for (volume, disk) in hotplugged(template) {
        if out.volumes.iter().flatten().any(|v| v.name == volume.name) {
            continue;
        }
        out.volumes
            .get_or_insert_with(Vec::new)
            .push(volume.clone());
        let disks = out.domain.devices.disks.get_or_insert_with(Vec::new);
        if !disks.iter().any(|d| d.name == disk.name) {
            disks.push(disk.clone());
        }
    }
    out
}

/// The hotplugged volumes of a spec with their disks: what virt-controller attaches to the
/// VMI's node and virt-handler plugs into the guest.
pub fn hotplugged(spec: &VirtualMachineInstanceSpec) -> Vec<(&Volume, &Disk)> {
    spec.volumes
        .iter()
        .flatten()
        .filter(|v| is_hotpluggable(v))
        .filter_map(|v| {
            spec.domain
                .devices
                .disks
                .iter()
                .flatten()
                .find(|d| d.name == v.name)
                .map(|d| (v, d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn spec(json: serde_json::Value) -> VirtualMachineInstanceSpec {
        serde_json::from_value(json).unwrap()
    }

    fn add(name: &str, claim: &str) -> VirtualMachineVolumeRequest {
        serde_json::from_value(serde_json::json!({"addVolumeOptions": {
            "name": name,
            "disk": {"disk": {"bus": "scsi"}, "serial": name},
            "volumeSource": {"persistentVolumeClaim": {"claimName": claim}}
        }}))
        .unwrap()
    }

    fn remove(name: &str) -> VirtualMachineVolumeRequest {
        serde_json::from_value(serde_json::json!({"removeVolumeOptions": {"name": name}})).unwrap()
    }

    fn base() -> VirtualMachineInstanceSpec {
        spec(serde_json::json!({
            "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "root-pvc"}}]
        }))
    }

    #[test]
    fn an_add_appends_a_hotpluggable_volume_and_its_named_disk_once() {
        let s = apply(&base(), &add("data", "data-pvc")).unwrap();
        let (volumes, disks) = (
            s.volumes.as_ref().unwrap(),
            s.domain.devices.disks.as_ref().unwrap(),
        );
        assert_eq!(volumes.len(), 2);
        assert!(is_hotpluggable(&volumes[1]));
        assert_eq!(disks[1].name, "data");
        assert_eq!(disks[1].serial.as_deref(), Some("data"));
        assert_eq!(hotplugged(&s).len(), 1);
        assert_eq!(apply(&s, &add("data", "data-pvc")).unwrap(), s);
        let back = apply(&s, &remove("data")).unwrap();
        assert_eq!(back, base());
        assert_eq!(apply(&back, &remove("data")).unwrap(), back);
    }

    #[test]
    fn requests_that_cannot_apply_name_the_volume() {
        let s = apply(&base(), &add("data", "data-pvc")).unwrap();
        assert_eq!(
            verify(
                s.volumes.as_deref().unwrap_or_default(),
                &add("data", "other")
            ),
            Err(RequestError::NameExists("data".into()))
        );
        assert_eq!(
            verify(
                s.volumes.as_deref().unwrap_or_default(),
                &add("other", "data-pvc")
            ),
            Err(RequestError::SourceExists("data-pvc".into()))
        );
        assert_eq!(
            verify(s.volumes.as_deref().unwrap_or_default(), &remove("root")),
            Err(RequestError::NotHotpluggable("root".into()))
        );
        assert_eq!(
            verify(s.volumes.as_deref().unwrap_or_default(), &remove("nope")),
            Err(RequestError::NotFound("nope".into()))
        );
        assert_eq!(
            verify(
                s.volumes.as_deref().unwrap_or_default(),
                &remove("data-pvc")
            ),
            Ok(())
        );
        let mut cdrom = add("cd", "cd-pvc");
        cdrom.add_volume_options.as_mut().unwrap().disk =
            Some(serde_json::from_value(serde_json::json!({"cdrom": {}})).unwrap());
        assert_eq!(
            verify(s.volumes.as_deref().unwrap_or_default(), &cdrom),
            Err(RequestError::DiskKind("cd".into()))
        );
        let mut sata = add("s", "s-pvc");
        sata.add_volume_options.as_mut().unwrap().disk =
            Some(serde_json::from_value(serde_json::json!({"disk": {"bus": "sata"}})).unwrap());
        assert_eq!(
            verify(s.volumes.as_deref().unwrap_or_default(), &sata),
            Err(RequestError::Bus("s".into(), "sata".into()))
        );
    }

    #[test]
    fn requests_queue_as_kubevirts_virt_api_queues_them() {
        let q = queue(&[], &add("a", "a-pvc")).unwrap();
        assert_eq!(q, vec![add("a", "a-pvc")]);
        assert_eq!(
            queue(&q, &add("a", "other")),
            Err(RequestError::AddPending("a".into()))
        );
        let q2 = queue(&q, &add("b", "b-pvc")).unwrap();
        // A remove cancels the pending add of its volume and is queued.
        let q3 = queue(&q2, &remove("a")).unwrap();
        assert_eq!(q3, vec![add("b", "b-pvc"), remove("a")]);
        assert_eq!(
            queue(&q3, &remove("a")),
            Err(RequestError::RemovePending("a".into()))
        );
        assert_eq!(
            queue(&q3, &add("a", "a-pvc")),
            Err(RequestError::RemovePendingBlocksAdd("a".into()))
        );
        assert_eq!(
            queue(&q3, &VirtualMachineVolumeRequest::default()),
            Err(RequestError::Empty)
        );
    }

    #[test]
    fn hotplugged_volumes_are_left_out_and_synced_alone() {
        let hot = apply(&base(), &add("data", "data-pvc")).unwrap();
        assert_eq!(without_hotplugged(&hot), without_hotplugged(&base()));
        assert_eq!(without_hotplugged(&base()), base());
        let mut json = serde_json::to_value(&hot).unwrap();
        strip_hotplugged_json(&mut json);
        assert_eq!(json, serde_json::to_value(base()).unwrap());
        let only_hot = spec(serde_json::json!({
            "domain": {"devices": {"disks": [{"name": "d", "disk": {"bus": "scsi"}}]}},
            "volumes": [{"name": "d", "dataVolume": {"name": "dv", "hotpluggable": true}}]
        }));
        let mut json = serde_json::to_value(&only_hot).unwrap();
        strip_hotplugged_json(&mut json);
        assert_eq!(json, serde_json::json!({"domain": {"devices": {}}}));
        assert_eq!(without_hotplugged(&only_hot).volumes, None);

        // Template gained a hotplugged volume: the VMI gets it; lost it: the VMI drops it;
        // the VMI's own volumes stay.
        assert_eq!(sync_hotplugged(&base(), &hot, &[]), hot);
        assert_eq!(sync_hotplugged(&hot, &base(), &[]), base());
        assert_eq!(sync_hotplugged(&hot, &hot, &[]), hot);
        // Hotplugged into the VMI alone: kept.
        assert_eq!(sync_hotplugged(&hot, &base(), &["data".into()]), hot);
        let mut other_root = base();
        other_root.volumes = None;
        assert_eq!(sync_hotplugged(&base(), &other_root, &[]), base());
    }

    #[test]
    fn the_ephemeral_annotation_follows_a_vmis_own_requests() {
        let a = ephemeral_after(None, &add("a", "a-pvc"));
        assert_eq!(a.as_deref(), Some("a"));
        let ab = ephemeral_after(a.as_deref(), &add("b", "b-pvc"));
        assert_eq!(ab.as_deref(), Some("a,b"));
        assert_eq!(ephemeral_after(ab.as_deref(), &add("b", "b-pvc")), ab);
        assert_eq!(
            ephemeral_after(ab.as_deref(), &remove("a")).as_deref(),
            Some("b")
        );
        assert_eq!(ephemeral_after(Some("b"), &remove("b")), None);
        assert_eq!(ephemeral_names(Some(" a, ,b")), ["a", "b"]);
    }
}
