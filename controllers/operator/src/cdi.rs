//! Coexistence with a real CDI (docs/design-datavolumes.md §3.1): where CDI's CRD
//! `datavolumes.cdi.kubevirt.io` exists, kube-apiserver serves `cdi.kubevirt.io/v1beta1`
//! itself, through the local APIService `v1beta1.cdi.kubevirt.io` its autoregister
//! controller keeps for every served CRD version. virt-operator then leaves that APIService to
//! kube-apiserver (it neither applies nor deletes one it did not make, and removes its own,
//! made before CDI came, so kube-apiserver's local one takes over: kube-apiserver leaves an
//! APIService it did not make alone, and recreates its own once the name is free), turns
//! virt-controller's DataVolume controller off, and says so in the KubeVirt resource's status.
//! The VM and VMI controllers keep reading and creating DataVolumes through
//! `cdi.kubevirt.io/v1beta1`: CDI's objects, same schema.
//!
//! [`decide`] is the whole decision, pure; cdi_step.rs reads the CRD and the APIService and
//! carries it out on every reconcile, so CDI installed (or removed) later is picked up within
//! a reconcile period.

use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;

/// CDI's DataVolume CRD: its existence means CDI owns `cdi.kubevirt.io`.
pub const DATAVOLUME_CRD: &str = "datavolumes.cdi.kubevirt.io";

/// The group both CDI and virt-apiserver serve.
pub const GROUP: &str = kubevirt_api::cdi::GROUP;

/// Label kube-apiserver's autoregister controller puts on the APIServices it manages (the
/// local ones of CRDs among them): `true` or `onstart`.
pub const AUTOMANAGED_LABEL: &str = "kube-aggregator.kubernetes.io/automanaged";

/// Type of the KubeVirt condition present while CDI owns DataVolumes.
pub const CONDITION: &str = "CDIInstalled";
/// Its reason.
pub const REASON: &str = "DataVolumesServedByCDI";

/// What the installation's own APIServices carry (render::labels): the part-of label.
const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "kubevirt-rs");

/// What to do with the APIService of one of CDI's group-versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiServiceStep {
    /// Apply ours (virt-apiserver serves the group).
    Apply,
    /// Leave whatever is there (kube-apiserver's, or nothing) alone.
    Leave,
    /// Delete ours, so that kube-apiserver's local APIService takes its place.
    DeleteOurs,
}

/// The operator's whole answer to "is CDI installed" for one reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The APIService of `cdi.kubevirt.io`.
    pub apiservice: ApiServiceStep,
    /// virt-controller runs its DataVolume controller (no flag: the default); `false`:
    /// `--datavolumes=false`.
    pub datavolume_controller: bool,
    /// The message of the [`CONDITION`] condition (absent without CDI).
    pub note: Option<String>,
}

/// Whether `a` is one of the installation's own (rendered with the part-of label).
pub fn is_ours(a: &APIService) -> bool {
    a.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(PART_OF.0))
        .is_some_and(|v| v == PART_OF.1)
}

/// Whether kube-apiserver's autoregister controller manages `a`.
pub fn is_automanaged(a: &APIService) -> bool {
    a.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(AUTOMANAGED_LABEL))
        .is_some_and(|v| v == "true" || v == "onstart")
}

/// What to do, given whether CDI's DataVolume CRD exists and the APIService of
/// `v1beta1.cdi.kubevirt.io` there is now.
///
/// - CRD present: ours (part-of label) goes, anything else stays untouched; the DataVolume
///   controller is off; the status says why.
/// - CRD absent: ours is applied, unless kube-apiserver's local one is still there (the CRD
///   was just deleted: kube-apiserver deletes its APIService itself; applying over it would
///   keep its automanaged label and have it deleted after ours is written).
pub fn decide(crd_exists: bool, existing: Option<&APIService>) -> Plan {
    if crd_exists {
        return Plan {
            apiservice: match existing {
                Some(a) if is_ours(a) => ApiServiceStep::DeleteOurs,
                _ => ApiServiceStep::Leave,
            },
            datavolume_controller: false,
            note: Some(format!(
                "CDI is installed (CRD {DATAVOLUME_CRD}): DataVolumes are CDI's; kubevirt-rs \
                 serves none and its DataVolume controller is off (VMs' dataVolumeTemplates \
                 use CDI's DataVolumes)"
            )),
        };
    }
    Plan {
        apiservice: match existing {
            Some(a) if is_automanaged(a) && !is_ours(a) => ApiServiceStep::Leave,
            _ => ApiServiceStep::Apply,
        },
        datavolume_controller: true,
        note: None,
    }
}

/// CDI's upload group (served by CDI's own cdi-apiserver, through an APIService of CDI's).
pub const UPLOAD_GROUP: &str = "upload.cdi.kubevirt.io";

/// Whether the APIService of `group` is governed by [`decide`] (each of CDI's groups, the one
/// kubevirt-rs serves today and its upload group should it serve that) rather than always
/// applied.
pub fn is_cdi_group(group: &str) -> bool {
    group == GROUP || group == UPLOAD_GROUP
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn apiservice(labels: serde_json::Value, service: bool) -> APIService {
        let mut spec = serde_json::json!({"group": GROUP, "version": "v1beta1",
            "groupPriorityMinimum": 1000, "versionPriority": 100});
        if service {
            spec["service"] =
                serde_json::json!({"namespace": "kubevirt", "name": "kubevirt-apiserver"});
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "v1beta1.cdi.kubevirt.io", "labels": labels},
            "spec": spec,
        }))
        .unwrap()
    }

    fn ours() -> APIService {
        apiservice(
            serde_json::json!({"app.kubernetes.io/name": "kubevirt-apiserver",
                               "app.kubernetes.io/part-of": "kubevirt-rs"}),
            true,
        )
    }

    fn local() -> APIService {
        apiservice(serde_json::json!({AUTOMANAGED_LABEL: "true"}), false)
    }

    #[test]
    fn without_cdi_ours_is_applied_and_the_controller_runs() {
        for existing in [None, Some(ours())] {
            let p = decide(false, existing.as_ref());
            assert_eq!(p.apiservice, ApiServiceStep::Apply);
            assert!(p.datavolume_controller);
            assert_eq!(p.note, None);
        }
        // Someone else's (not kube-apiserver's local one): ours is the group's server.
        let other = apiservice(serde_json::json!({}), true);
        assert_eq!(
            decide(false, Some(&other)).apiservice,
            ApiServiceStep::Apply
        );
    }

    #[test]
    fn with_cdi_ours_goes_and_kube_apiservers_stays() {
        let p = decide(true, Some(&ours()));
        assert_eq!(p.apiservice, ApiServiceStep::DeleteOurs);
        assert!(!p.datavolume_controller);
        let note = p.note.unwrap();
        assert!(
            note.starts_with(
                "CDI is installed (CRD datavolumes.cdi.kubevirt.io): DataVolumes are CDI's; \
                 kubevirt-rs serves none"
            ),
            "{note}"
        );
        for existing in [
            None,
            Some(local()),
            Some(apiservice(serde_json::json!({}), true)),
        ] {
            let p = decide(true, existing.as_ref());
            assert_eq!(p.apiservice, ApiServiceStep::Leave, "{existing:?}");
            assert!(!p.datavolume_controller);
            assert!(p.note.is_some());
        }
    }

    #[test]
    fn a_local_apiservice_left_by_a_removed_crd_is_not_written_over() {
        // kube-apiserver deletes it itself; ours follows on the next reconcile.
        let p = decide(false, Some(&local()));
        assert_eq!(p.apiservice, ApiServiceStep::Leave);
        assert!(p.datavolume_controller);
        assert_eq!(p.note, None);
        assert!(is_automanaged(&local()) && !is_ours(&local()));
        assert!(is_ours(&ours()) && !is_automanaged(&ours()));
    }

    #[test]
    fn only_cdis_groups_are_governed() {
        assert!(is_cdi_group("cdi.kubevirt.io"));
        assert!(is_cdi_group("upload.cdi.kubevirt.io"));
        assert!(!is_cdi_group("kubevirt.io"));
        assert!(!is_cdi_group("subresources.kubevirt.io"));
    }
}
