//! `addvolume` and `removevolume`, as upstream virtctl: the request goes to the VMI's
//! subresource (the VMI alone, until it stops), or with `--persist` to the VM's (its
//! template, and so its running VMI). The volume's source is the DataVolume of that name
//! when one exists, else the claim of that name.

use std::io::Write;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kubevirt_api::catalogue::VmAction;
use kubevirt_api::cdi::DataVolume;
use kubevirt_api::hotplug::{AddVolumeOptions, HotplugVolumeSource, RemoveVolumeOptions};
use kubevirt_api::options::dry_run_all;
use kubevirt_api::vmi::{
    DataVolumeSource, Disk, DiskBus, DiskCache, DiskTarget, LunTarget,
    PersistentVolumeClaimVolumeSource,
};

use crate::connect::Session;
use crate::error::{CliError, Target, from_kube};
use crate::request::{Action, validate_name};

/// The flags of `addvolume`, as virtctl names them.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct AddVolumeArgs {
    /// Name of the VMI (with --persist, of the VM).
    #[arg(value_name = "VMI")]
    pub name: String,
    /// Name used in the volumes section of the spec: the DataVolume or claim of that name.
    #[arg(long)]
    pub volume_name: String,
    /// Serial number to assign to the disk (default: the volume name).
    #[arg(long)]
    pub serial: Option<String>,
    /// Cache mode of the disk: none, writethrough or writeback.
    #[arg(long)]
    pub cache: Option<String>,
    /// Persist the volume in the VM's spec (if it exists) rather than the VMI alone.
    #[arg(long)]
    pub persist: bool,
    /// Ask the server to validate the request without changing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Disk type to hotplug: disk or lun.
    #[arg(long, default_value = "disk")]
    pub disk_type: String,
    /// Disk bus: scsi or virtio (a lun: scsi only).
    #[arg(long, default_value = "scsi")]
    pub bus: String,
}

/// The flags of `removevolume`.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct RemoveVolumeArgs {
    /// Name of the VMI (with --persist, of the VM).
    #[arg(value_name = "VMI")]
    pub name: String,
    /// Name used in the volumes section of the spec.
    #[arg(long)]
    pub volume_name: String,
    /// Remove the volume from the VM's spec (if it exists) rather than the VMI alone.
    #[arg(long)]
    pub persist: bool,
    /// Ask the server to validate the request without changing anything.
    #[arg(long)]
    pub dry_run: bool,
}

/// Where the volume comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    DataVolume,
    Claim,
}

/// The `AddVolumeOptions` virtctl sends for these flags; its usage errors otherwise.
pub fn add_options(a: &AddVolumeArgs, source: Source) -> Result<AddVolumeOptions, String> {
    let bus = match a.bus.as_str() {
        "scsi" => DiskBus::Scsi,
        "virtio" => DiskBus::Virtio,
        other => {
            return Err(if a.disk_type == "lun" {
                format!("Invalid bus type '{other}' for LUN disk. Only 'scsi' bus is supported.")
            } else {
                format!(
                    "Invalid bus type '{other}' for disk. Only 'scsi' and 'virtio' are supported."
                )
            });
        }
    };
    let mut disk = Disk::default();
    match a.disk_type.as_str() {
        "disk" => {
            disk.disk = Some(DiskTarget {
                bus: Some(bus),
                ..DiskTarget::default()
            })
        }
        "lun" if bus == DiskBus::Scsi => {
            disk.lun = Some(LunTarget {
                bus: Some(bus),
                ..LunTarget::default()
            })
        }
        "lun" => {
            return Err(format!(
                "Invalid bus type '{}' for LUN disk. Only 'scsi' bus is supported.",
                a.bus
            ));
        }
        other => {
            return Err(format!(
                "Invalid disk type '{other}'. Only LUN and Disk are supported."
            ));
        }
    }
    disk.serial = Some(
        a.serial
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| a.volume_name.clone()),
    );
    disk.cache = match a.cache.as_deref() {
        None | Some("") => None,
        Some("none") => Some(DiskCache::None),
        Some("writethrough") => Some(DiskCache::Writethrough),
        Some("writeback") => Some(DiskCache::Writeback),
        Some(other) => return Err(format!("error adding volume, invalid cache value {other}")),
    };
    let name = a.volume_name.clone();
    let volume_source = match source {
        Source::DataVolume => HotplugVolumeSource {
            data_volume: Some(DataVolumeSource {
                name: name.clone(),
                hotpluggable: Some(true),
            }),
            ..HotplugVolumeSource::default()
        },
        Source::Claim => HotplugVolumeSource {
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: name.clone(),
                hotpluggable: Some(true),
                ..PersistentVolumeClaimVolumeSource::default()
            }),
            ..HotplugVolumeSource::default()
        },
    };
    Ok(AddVolumeOptions {
        name,
        disk: Some(disk),
        volume_source: Some(volume_source),
        dry_run: dry_run_all(a.dry_run),
    })
}

/// The action of an add: the VMI's subresource, the VM's with `--persist`.
pub fn add_action(o: AddVolumeOptions, persist: bool) -> VmAction {
    if persist {
        VmAction::AddVolumeVm(Box::new(o))
    } else {
        VmAction::AddVolumeVmi(Box::new(o))
    }
}

/// The action of a remove.
pub fn remove_action(a: &RemoveVolumeArgs) -> VmAction {
    let o = RemoveVolumeOptions {
        name: a.volume_name.clone(),
        dry_run: dry_run_all(a.dry_run),
    };
    if a.persist {
        VmAction::RemoveVolumeVm(o)
    } else {
        VmAction::RemoveVolumeVmi(o)
    }
}

fn read_target(session: &Session, resource: &'static str, name: &str) -> Target {
    Target {
        kind: if resource == "datavolumes" {
            "DataVolume"
        } else {
            "PersistentVolumeClaim"
        },
        group: if resource == "datavolumes" {
            kubevirt_api::cdi::GROUP
        } else {
            ""
        },
        resource,
        subresource: None,
        verb: "get",
        action: "get",
        name: name.to_owned(),
        namespace: session.namespace.clone(),
    }
}

/// The DataVolume of that name if one exists, else the claim; virtctl's error if neither.
async fn source_of(session: &Session, volume: &str) -> Result<Source, CliError> {
    let dvs: Api<DataVolume> = Api::namespaced(session.client.clone(), &session.namespace);
    match dvs.get_opt(volume).await {
        Ok(Some(_)) => return Ok(Source::DataVolume),
        Ok(None) => {}
        // Without CDI there are no DataVolumes: look for the claim.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => {}
        Err(e) => {
            return Err(from_kube(
                &read_target(session, "datavolumes", volume),
                &session.server,
                e,
            ));
        }
    }
    let pvcs: Api<PersistentVolumeClaim> =
        Api::namespaced(session.client.clone(), &session.namespace);
    match pvcs.get_opt(volume).await {
        Ok(Some(_)) => Ok(Source::Claim),
        Ok(None) => Err(CliError::Usage(format!(
            "error adding volume, Volume {volume} is not a DataVolume or PersistentVolumeClaim"
        ))),
        Err(e) => Err(from_kube(
            &read_target(session, "persistentvolumeclaims", volume),
            &session.server,
            e,
        )),
    }
}

async fn send(session: &Session, action: VmAction, name: &str) -> Result<(), CliError> {
    let req = Action::Vm(action).request(&session.namespace, name)?;
    crate::ops::put_request(session, &req).await
}

/// `addvolume VMI --volume-name=X …`.
pub async fn add(
    session: &Session,
    a: &AddVolumeArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    validate_name("name", &a.name)?;
    validate_name("volume name", &a.volume_name)?;
    // The flags first: a usage error needs no server.
    add_options(a, Source::Claim).map_err(CliError::Usage)?;
    let source = source_of(session, &a.volume_name).await?;
    let options = add_options(a, source).map_err(CliError::Usage)?;
    send(session, add_action(options, a.persist), &a.name).await?;
    writeln!(
        out,
        "Successfully submitted add volume request to VM {} for volume {}",
        a.name, a.volume_name
    )
    .map_err(|e| CliError::io("writing output", e))
}

/// `removevolume VMI --volume-name=X …`.
pub async fn remove(
    session: &Session,
    a: &RemoveVolumeArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    validate_name("name", &a.name)?;
    validate_name("volume name", &a.volume_name)?;
    send(session, remove_action(a), &a.name).await?;
    writeln!(
        out,
        "Successfully submitted remove volume request to VM {} for volume {}",
        a.name, a.volume_name
    )
    .map_err(|e| CliError::io("writing output", e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn args(extra: impl FnOnce(&mut AddVolumeArgs)) -> AddVolumeArgs {
        let mut a = AddVolumeArgs {
            name: "vm1".into(),
            volume_name: "data".into(),
            serial: None,
            cache: None,
            persist: false,
            dry_run: false,
            disk_type: "disk".into(),
            bus: "scsi".into(),
        };
        extra(&mut a);
        a
    }

    #[test]
    fn add_sends_virtctls_options_to_the_vmi_or_with_persist_the_vm() {
        let o = add_options(&args(|_| {}), Source::Claim).unwrap();
        assert_eq!(
            serde_json::to_value(&o).unwrap(),
            serde_json::json!({"name": "data",
                "disk": {"name": "", "disk": {"bus": "scsi"}, "serial": "data"},
                "volumeSource": {"persistentVolumeClaim": {"claimName": "data", "hotpluggable": true}}})
        );
        let path = |a: VmAction| {
            Action::Vm(a)
                .request("ns", "vm1")
                .map(|r| r.path)
                .unwrap_or_default()
        };
        assert!(
            path(add_action(o.clone(), false)).ends_with("/virtualmachineinstances/vm1/addvolume")
        );
        assert!(path(add_action(o, true)).ends_with("/virtualmachines/vm1/addvolume"));
        let dv = add_options(
            &args(|a| {
                a.serial = Some("s1".into());
                a.cache = Some("writeback".into());
                a.dry_run = true;
                a.bus = "virtio".into();
            }),
            Source::DataVolume,
        )
        .unwrap();
        let v = serde_json::to_value(&dv).unwrap();
        assert_eq!(v["volumeSource"]["dataVolume"]["name"], "data");
        assert_eq!(v["disk"]["serial"], "s1");
        assert_eq!(v["disk"]["cache"], "writeback");
        assert_eq!(v["disk"]["disk"]["bus"], "virtio");
        assert_eq!(v["dryRun"], serde_json::json!(["All"]));
        let lun = add_options(&args(|a| a.disk_type = "lun".into()), Source::Claim).unwrap();
        assert_eq!(
            serde_json::to_value(&lun).unwrap()["disk"]["lun"]["bus"],
            "scsi"
        );
    }

    #[test]
    fn bad_flags_are_virtctls_usage_errors() {
        let err = |f: fn(&mut AddVolumeArgs)| add_options(&args(f), Source::Claim).err();
        assert_eq!(
            err(|a| a.bus = "sata".into()).as_deref(),
            Some("Invalid bus type 'sata' for disk. Only 'scsi' and 'virtio' are supported.")
        );
        assert_eq!(
            err(|a| {
                a.disk_type = "lun".into();
                a.bus = "virtio".into();
            })
            .as_deref(),
            Some("Invalid bus type 'virtio' for LUN disk. Only 'scsi' bus is supported.")
        );
        assert_eq!(
            err(|a| a.disk_type = "cdrom".into()).as_deref(),
            Some("Invalid disk type 'cdrom'. Only LUN and Disk are supported.")
        );
        assert_eq!(
            err(|a| a.cache = Some("unsafe".into())).as_deref(),
            Some("error adding volume, invalid cache value unsafe")
        );
    }

    #[test]
    fn remove_goes_to_the_vmi_or_with_persist_the_vm() {
        let mut a = RemoveVolumeArgs {
            name: "vm1".into(),
            volume_name: "data".into(),
            persist: false,
            dry_run: true,
        };
        let r = Action::Vm(remove_action(&a)).request("ns", "vm1").unwrap();
        assert!(
            r.path
                .ends_with("/virtualmachineinstances/vm1/removevolume")
        );
        assert_eq!(
            r.body,
            serde_json::json!({"name": "data", "dryRun": ["All"]})
        );
        a.persist = true;
        let r = Action::Vm(remove_action(&a)).request("ns", "vm1").unwrap();
        assert!(r.path.ends_with("/virtualmachines/vm1/removevolume"));
    }
}
