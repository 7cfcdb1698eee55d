//! The PersistentVolumeClaims behind a VMI's `persistentVolumeClaim` volumes: what the
//! launcher pod needs to mount them, what `status.volumeStatus` reports, and why a VMI
//! cannot start yet. [`lookup`] reads the claims; everything else is pure.
//!
//! KubeVirt's conventions: a Filesystem-mode claim holds a raw `disk.img` at its root,
//! created sparse by the launcher when absent, at the claim's capacity less the filesystem
//! overhead (CDI's default, 5.5 %); a Block-mode claim is the raw device.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kubevirt_api::VirtualMachineInstance;
use kubevirt_api::cdi::DataVolume;
use kubevirt_api::quantity;
use kubevirt_api::vmi::{PersistentVolumeClaimInfo, VolumeStatus};

/// Share of a Filesystem-mode claim kept free for the filesystem itself (CDI's and
/// KubeVirt's default `filesystemOverhead`).
pub const FILESYSTEM_OVERHEAD: f64 = 0.055;
/// The overhead as KubeVirt reports it in `persistentVolumeClaimInfo.filesystemOverhead`.
pub const FILESYSTEM_OVERHEAD_STR: &str = "0.055";
/// disk.img sizes are whole MiB: QEMU and most guests want aligned disks.
const ALIGN: u64 = 1 << 20;

/// How a claim is presented to the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A filesystem with `disk.img` at its root.
    Filesystem,
    /// A raw block device.
    Block,
}

/// What the controller knows of one volume's claim.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// The claim's name.
    pub claim_name: String,
    /// Filesystem or Block.
    pub mode: Mode,
    /// The bound volume's capacity, else the request, in bytes.
    pub capacity: Option<u64>,
    /// `Bound`, `Pending` or `Lost`.
    pub phase: String,
    /// As `status.volumeStatus[].persistentVolumeClaimInfo` reports it.
    pub info: PersistentVolumeClaimInfo,
}

impl Claim {
    /// The facts of `pvc`, for a volume that names it.
    pub fn from_pvc(pvc: &PersistentVolumeClaim) -> Self {
        let spec = pvc.spec.clone().unwrap_or_default();
        let status = pvc.status.clone().unwrap_or_default();
        let mode = match spec.volume_mode.as_deref() {
            Some("Block") => Mode::Block,
            _ => Mode::Filesystem,
        };
        let requests = spec.resources.as_ref().and_then(|r| r.requests.clone());
        let capacity_map = status.capacity.clone();
        let bytes = |m: &Option<BTreeMap<String, Quantity>>| {
            m.as_ref()
                .and_then(|m| m.get("storage"))
                .and_then(|q| quantity::parse_bytes(&q.0).ok())
        };
        let capacity = bytes(&capacity_map).or_else(|| bytes(&requests));
        Claim {
            claim_name: pvc.metadata.name.clone().unwrap_or_default(),
            mode,
            capacity,
            phase: status.phase.clone().unwrap_or_else(|| "Pending".into()),
            info: PersistentVolumeClaimInfo {
                claim_name: pvc.metadata.name.clone(),
                access_modes: status.access_modes.clone().or(spec.access_modes.clone()),
                volume_mode: Some(
                    match mode {
                        Mode::Filesystem => "Filesystem",
                        Mode::Block => "Block",
                    }
                    .into(),
                ),
                capacity: capacity_map,
                requests,
                filesystem_overhead: (mode == Mode::Filesystem)
                    .then(|| FILESYSTEM_OVERHEAD_STR.to_string()),
            },
        }
    }

    /// The size of a `disk.img` the launcher creates in this (Filesystem) claim, when there
    /// is none: the capacity less the overhead, in whole MiB.
    pub fn disk_img_size(&self) -> Option<u64> {
        disk_img_size(self.capacity?)
    }
}

fn disk_img_size(capacity: u64) -> Option<u64> {
    let usable = (capacity as f64 * (1.0 - FILESYSTEM_OVERHEAD)) as u64;
    Some(usable / ALIGN * ALIGN).filter(|s| *s > 0)
}

/// The `disk.img` the launcher (or an importer) puts in a Filesystem claim of `capacity`
/// bytes: [`Claim::disk_img_size`] for a capacity alone.
pub fn usable_bytes(capacity: u64) -> Option<u64> {
    disk_img_size(capacity)
}

/// The smallest request, in whole MiB, of a Filesystem claim whose `disk.img` holds
/// `disk` bytes: the inverse of [`disk_img_size`], so that a DataVolume's
/// `storage: 1Gi` yields a 1 GiB disk (CDI grows `storage:` requests by the overhead
/// the same way). Checked against [`disk_img_size`] itself, so float rounding can never
/// leave the disk a MiB short.
pub fn request_for_disk(disk: u64) -> u64 {
    let disk = disk.div_ceil(ALIGN) * ALIGN;
    let mut request =
        ((disk as f64 / (1.0 - FILESYSTEM_OVERHEAD)).ceil() as u64).div_ceil(ALIGN) * ALIGN;
    while disk_img_size(request).is_none_or(|s| s < disk) {
        request += ALIGN;
    }
    request
}

/// How the pod presents a claim volume, from what `status.volumeStatus` says of it: the
/// launcher pod is rendered from the VMI alone (also a migration's target pod).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Presented {
    pub mode: Mode,
    /// Bytes of a new `disk.img` (Filesystem mode).
    pub disk_img_size: Option<u64>,
}

/// [`Presented`] of volume `volume` of `vmi`, when the VMI controller has recorded its claim.
pub fn presented(vmi: &VirtualMachineInstance, volume: &str) -> Option<Presented> {
    let info = vmi
        .status
        .as_ref()?
        .volume_status
        .as_ref()?
        .iter()
        .find(|s| s.name == volume)?
        .persistent_volume_claim_info
        .as_ref()?;
    let mode = match info.volume_mode.as_deref() {
        Some("Block") => Mode::Block,
        _ => Mode::Filesystem,
    };
    let bytes = |m: &Option<BTreeMap<String, Quantity>>| {
        m.as_ref()
            .and_then(|m| m.get("storage"))
            .and_then(|q| quantity::parse_bytes(&q.0).ok())
    };
    let capacity = bytes(&info.capacity).or_else(|| bytes(&info.requests));
    Some(Presented {
        mode,
        disk_img_size: match mode {
            Mode::Filesystem => capacity.and_then(disk_img_size),
            Mode::Block => None,
        },
    })
}

/// Why a VMI's claims keep it from starting; each names the volume and the claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The claim does not exist (yet).
    NotFound { volume: String, claim: String },
    /// Neither the DataVolume nor a claim of its name exists (yet).
    DataVolumeNotFound { volume: String, name: String },
    /// The DataVolume is still populating its claim: the start waits, nothing is wrong.
    DataVolumeNotReady {
        volume: String,
        name: String,
        phase: String,
    },
    /// The DataVolume failed (or keeps failing) to populate its claim.
    DataVolumeFailed {
        volume: String,
        name: String,
        phase: String,
        /// Its Running condition's reason and message.
        why: String,
    },
}

impl Problem {
    /// The VMI's Synchronized reason, as KubeVirt names it; None for a wait that is no
    /// error (KubeVirt sets no condition for a DataVolume still importing).
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Problem::NotFound { .. } | Problem::DataVolumeNotFound { .. } => {
                Some(super::decide::reasons::PVC_NOT_FOUND)
            }
            Problem::DataVolumeNotReady { .. } => None,
            Problem::DataVolumeFailed { .. } => {
                Some(super::decide::reasons::FAILED_DATA_VOLUME_IMPORT)
            }
        }
    }

    pub fn message(&self, ns: &str) -> String {
        match self {
            Problem::NotFound { volume, claim } => format!(
                "volume {volume}: PVC {ns}/{claim} does not exist, waiting for it to appear"
            ),
            Problem::DataVolumeNotFound { volume, name } => format!(
                "volume {volume}: DataVolume {ns}/{name} does not exist (nor a PVC of its name), \
                 waiting for it to appear"
            ),
            Problem::DataVolumeNotReady {
                volume,
                name,
                phase,
            } => format!("volume {volume}: DataVolume {ns}/{name} is {phase}"),
            Problem::DataVolumeFailed {
                volume,
                name,
                phase,
                why,
            } => format!("volume {volume}: DataVolume {ns}/{name} failed ({phase}): {why}"),
        }
    }
}

/// The claims of `vmi`'s volumes by volume name, and what is wrong with them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Claims {
    pub found: BTreeMap<String, Claim>,
    pub problems: Vec<Problem>,
    /// The VMI has `dataVolume` volumes (it gets a DataVolumesReady condition).
    pub data_volumes: bool,
}

impl Claims {
    /// What each DataVolume that is not ready waits on, for DataVolumesReady.
    pub fn data_volumes_not_ready(&self, ns: &str) -> Vec<String> {
        self.problems
            .iter()
            .filter(|p| {
                matches!(
                    p,
                    Problem::DataVolumeNotFound { .. }
                        | Problem::DataVolumeNotReady { .. }
                        | Problem::DataVolumeFailed { .. }
                )
            })
            .map(|p| p.message(ns))
            .collect()
    }
}

/// Volume name → claim name of every `persistentVolumeClaim` volume.
pub fn claim_volumes(vmi: &VirtualMachineInstance) -> Vec<(String, String)> {
    vmi.spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            let pvc = v.persistent_volume_claim.as_ref()?;
            Some((v.name.clone(), pvc.claim_name.clone()))
        })
        .collect()
}

/// `vmi` with each `dataVolume` volume as the `persistentVolumeClaim` volume of its claim
/// (named as the DataVolume, as KubeVirt and CDI name it): the launcher pod mounts it
/// exactly as any claim, and the launcher, which knows only claims, is handed the VMI so.
pub fn as_claims(vmi: &VirtualMachineInstance) -> std::borrow::Cow<'_, VirtualMachineInstance> {
    let has = vmi
        .spec
        .volumes
        .iter()
        .flatten()
        .any(|v| v.data_volume.is_some());
    if !has {
        return std::borrow::Cow::Borrowed(vmi);
    }
    let mut out = vmi.clone();
    for v in out.spec.volumes.iter_mut().flatten() {
        if let Some(dv) = v.data_volume.take() {
            v.persistent_volume_claim =
                Some(kubevirt_api::vmi::PersistentVolumeClaimVolumeSource {
                    claim_name: dv.name,
                    ..Default::default()
                });
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Whether `dv` may be used by a launcher pod: Succeeded (or PendingPopulation, which
/// KubeVirt counts too), or WaitForFirstConsumer: a blank claim that the launcher pod
/// itself binds (node/launcher creates its sparse `disk.img`).
pub fn data_volume_usable(dv: &DataVolume) -> bool {
    crate::vm::decide::data_volume_ready(dv)
}

/// Reads the claims `vmi` names, and the DataVolumes of its `dataVolume` volumes. A VMI
/// without claim or DataVolume volumes costs no call.
pub async fn lookup(
    client: &kube::Client,
    ns: &str,
    vmi: &VirtualMachineInstance,
) -> Result<Claims, kube::Error> {
    let mut out = Claims::default();
    let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let dvs = Api::<DataVolume>::namespaced(client.clone(), ns);
    for v in vmi.spec.volumes.iter().flatten() {
        let Some(dv) = &v.data_volume else { continue };
        out.data_volumes = true;
        let volume = v.name.clone();
        // Where DataVolumes are not served the read is a 404 too: a claim of the name is
        // then used as it is (KubeVirt does the same once a DataVolume is gone).
        let (claim_name, status) = match dvs.get_opt(&dv.name).await? {
            Some(d) => {
                let phase = d
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Pending".into());
                if crate::vm::decide::data_volume_error(&d) {
                    let why = d
                        .status
                        .as_ref()
                        .and_then(|s| s.condition(kubevirt_api::cdi::phase::CONDITION_RUNNING))
                        .map(|c| {
                            format!(
                                "{}: {}",
                                c.reason.as_deref().unwrap_or_default(),
                                c.message.as_deref().unwrap_or_default()
                            )
                        })
                        .unwrap_or_default();
                    out.problems.push(Problem::DataVolumeFailed {
                        volume,
                        name: dv.name.clone(),
                        phase,
                        why,
                    });
                    continue;
                }
                if !data_volume_usable(&d) {
                    out.problems.push(Problem::DataVolumeNotReady {
                        volume,
                        name: dv.name.clone(),
                        phase,
                    });
                    continue;
                }
                let claim = d
                    .status
                    .as_ref()
                    .and_then(|s| s.claim_name.clone())
                    .unwrap_or_else(|| dv.name.clone());
                (claim, true)
            }
            None => (dv.name.clone(), false),
        };
        match api.get_opt(&claim_name).await? {
            Some(pvc) if pvc.metadata.deletion_timestamp.is_none() => {
                out.found.insert(volume, Claim::from_pvc(&pvc));
            }
            _ if status => out.problems.push(Problem::NotFound {
                volume,
                claim: claim_name,
            }),
            _ => out.problems.push(Problem::DataVolumeNotFound {
                volume,
                name: dv.name.clone(),
            }),
        }
    }
    let wanted = claim_volumes(vmi);
    for (volume, claim) in wanted {
        match api.get_opt(&claim).await? {
            Some(pvc) if pvc.metadata.deletion_timestamp.is_none() => {
                out.found.insert(volume, Claim::from_pvc(&pvc));
            }
            _ => out.problems.push(Problem::NotFound { volume, claim }),
        }
    }
    Ok(out)
}

/// `status.volumeStatus` with the claims' facts: one entry per claim volume (others kept
/// as they are), sorted by volume name.
pub fn volume_status(old: Option<&[VolumeStatus]>, claims: &Claims) -> Option<Vec<VolumeStatus>> {
    let mut out: Vec<VolumeStatus> = old
        .unwrap_or_default()
        .iter()
        .filter(|s| !claims.found.contains_key(&s.name))
        .cloned()
        .collect();
    for (volume, claim) in &claims.found {
        let prev = old
            .unwrap_or_default()
            .iter()
            .find(|s| &s.name == volume)
            .cloned()
            .unwrap_or_default();
        out.push(VolumeStatus {
            name: volume.clone(),
            persistent_volume_claim_info: Some(claim.info.clone()),
            ..prev
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn pvc(json: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_bound_filesystem_claim_gets_its_capacity_less_the_overhead_in_whole_mib() {
        let c = Claim::from_pvc(&pvc(serde_json::json!({
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "2Gi"}}
        })));
        assert_eq!(c.mode, Mode::Filesystem);
        assert_eq!(c.capacity, Some(2 << 30));
        // 2 GiB × 0.945 = 1935.36 MiB → 1935 MiB.
        assert_eq!(c.disk_img_size(), Some(1935 << 20));
        assert_eq!(c.info.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(c.info.filesystem_overhead.as_deref(), Some("0.055"));
        assert_eq!(c.info.capacity.unwrap()["storage"].0, "2Gi");
    }

    #[test]
    fn a_pending_claim_uses_its_request_and_block_claims_have_no_overhead() {
        let c = Claim::from_pvc(&pvc(serde_json::json!({
            "metadata": {"name": "raw"},
            "spec": {"volumeMode": "Block", "accessModes": ["ReadWriteMany"],
                     "resources": {"requests": {"storage": "512Mi"}}}
        })));
        assert_eq!(c.mode, Mode::Block);
        assert_eq!(c.phase, "Pending");
        assert_eq!(c.capacity, Some(512 << 20));
        assert_eq!(c.info.filesystem_overhead, None);
        assert_eq!(c.info.access_modes, Some(vec!["ReadWriteMany".to_string()]));
    }

    #[test]
    fn request_for_disk_inverts_the_overhead_in_whole_mib() {
        for disk in [
            1u64 << 20,
            64 << 20,
            1 << 30,
            10 << 30,
            (1 << 30) + 1,
            3_000_000_123,
        ] {
            let r = request_for_disk(disk);
            assert_eq!(r % ALIGN, 0, "{disk}");
            assert!(usable_bytes(r).unwrap() >= disk, "{disk} → {r}");
            assert!(
                usable_bytes(r - ALIGN).is_none_or(|u| u < disk.div_ceil(ALIGN) * ALIGN),
                "{disk} → {r} is not the smallest"
            );
        }
        // 1 GiB ÷ 0.945 = 1083.6 MiB → 1084 MiB.
        assert_eq!(request_for_disk(1 << 30), 1084 << 20);
    }

    #[test]
    fn a_tiny_claim_has_no_disk_img_size() {
        let c = Claim::from_pvc(&pvc(serde_json::json!({
            "metadata": {"name": "t"},
            "spec": {"resources": {"requests": {"storage": "1Ki"}}}
        })));
        assert_eq!(c.disk_img_size(), None);
    }

    #[test]
    fn volume_status_keeps_other_volumes_and_replaces_claim_entries() {
        let c = Claim::from_pvc(&pvc(serde_json::json!({
            "metadata": {"name": "data"},
            "spec": {"resources": {"requests": {"storage": "1Gi"}}}
        })));
        let claims = Claims {
            found: BTreeMap::from([("disk".to_string(), c)]),
            problems: vec![],
            data_volumes: false,
        };
        let old = vec![
            VolumeStatus {
                name: "boot".into(),
                target: Some("vda".into()),
                ..VolumeStatus::default()
            },
            VolumeStatus {
                name: "disk".into(),
                target: Some("vdb".into()),
                ..VolumeStatus::default()
            },
        ];
        let s = volume_status(Some(&old), &claims).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "boot");
        assert_eq!(s[1].target.as_deref(), Some("vdb"));
        assert!(s[1].persistent_volume_claim_info.is_some());
        assert_eq!(volume_status(None, &Claims::default()), None);
    }

    #[test]
    fn problems_name_the_volume_and_the_claim() {
        let p = Problem::NotFound {
            volume: "disk".into(),
            claim: "data".into(),
        };
        assert_eq!(p.reason(), Some("FailedPvcNotFound"));
        assert_eq!(
            p.message("ns"),
            "volume disk: PVC ns/data does not exist, waiting for it to appear"
        );
        let d = Problem::DataVolumeNotReady {
            volume: "root".into(),
            name: "dv".into(),
            phase: "ImportInProgress".into(),
        };
        assert_eq!(d.reason(), None, "a DataVolume still importing is no error");
        assert_eq!(
            d.message("ns"),
            "volume root: DataVolume ns/dv is ImportInProgress"
        );
        let f = Problem::DataVolumeFailed {
            volume: "root".into(),
            name: "dv".into(),
            phase: "ImportInProgress".into(),
            why: "HTTPNotFound: 404".into(),
        };
        assert_eq!(f.reason(), Some("FailedDataVolumeImport"));
        assert!(f.message("ns").contains("HTTPNotFound: 404"));
    }

    #[test]
    fn data_volume_volumes_become_claims_of_the_same_name() {
        let vmi: VirtualMachineInstance = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "v"},
            "spec": {"domain": {"devices": {}}, "volumes": [
                {"name": "root", "dataVolume": {"name": "root-dv"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]}
        }))
        .unwrap();
        let c = as_claims(&vmi);
        let vols = c.spec.volumes.as_ref().unwrap();
        assert!(vols[0].data_volume.is_none());
        assert_eq!(
            vols[0].persistent_volume_claim.as_ref().unwrap().claim_name,
            "root-dv"
        );
        assert_eq!(claim_volumes(&c).len(), 2);
        let plain = serde_json::from_value::<VirtualMachineInstance>(serde_json::json!({
            "metadata": {"name": "v"}, "spec": {"domain": {"devices": {}}}
        }))
        .unwrap();
        assert!(matches!(as_claims(&plain), std::borrow::Cow::Borrowed(_)));
    }
}
