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
}
