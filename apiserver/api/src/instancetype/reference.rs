//! A VM's two references, its instance type and its preference, and what each leads to:
//! the VM's field, its status entry, the kind it names and the spec its revision holds.
//! virt-apiserver's expand endpoints and virt-controller's capture both walk them.

use k8s_openapi::api::apps::v1::ControllerRevision;
use serde_json::Value;

use super::revision::{self, RevisionError};
use super::vm::{instancetype_is_namespaced, preference_is_namespaced};
use crate::catalogue::Kind;
use crate::kinds::{self, KindStrategy};
use crate::vm::{InstancetypeStatusRef, Matcher, VirtualMachine};

/// One of a VM's two references.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference {
    Instancetype,
    Preference,
}

impl Reference {
    /// Both, in the order KubeVirt applies them.
    pub const BOTH: [Reference; 2] = [Reference::Instancetype, Reference::Preference];

    /// `spec.instancetype` or `spec.preference`.
    pub fn matcher(self, vm: &VirtualMachine) -> Option<&Matcher> {
        match self {
            Self::Instancetype => vm.spec.instancetype.as_ref(),
            Self::Preference => vm.spec.preference.as_ref(),
        }
    }

    /// `status.instancetypeRef` or `status.preferenceRef`.
    pub fn status_ref(self, vm: &VirtualMachine) -> Option<&InstancetypeStatusRef> {
        let s = vm.status.as_ref()?;
        match self {
            Self::Instancetype => s.instancetype_ref.as_ref(),
            Self::Preference => s.preference_ref.as_ref(),
        }
    }

    /// The strategy of the kind the matcher names (the cluster-wide one by default).
    pub fn strategy(self, m: &Matcher) -> &'static KindStrategy {
        match self {
            Self::Instancetype if instancetype_is_namespaced(m) => &kinds::instancetype::STRATEGY,
            Self::Instancetype => &kinds::cluster_instancetype::STRATEGY,
            Self::Preference if preference_is_namespaced(m) => &kinds::preference::STRATEGY,
            Self::Preference => &kinds::cluster_preference::STRATEGY,
        }
    }

    /// The kind the matcher names.
    pub fn kind(self, m: &Matcher) -> &'static Kind {
        self.strategy(m).meta
    }

    /// The VM's field, for errors.
    pub fn field(self) -> &'static str {
        match self {
            Self::Instancetype => "spec.instancetype",
            Self::Preference => "spec.preference",
        }
    }

    /// The spec a captured revision holds.
    pub fn revision_spec(self, r: &ControllerRevision) -> Result<Value, RevisionError> {
        match self {
            Self::Instancetype => revision::instancetype_spec(r),
            Self::Preference => revision::preference_spec(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matcher_names_the_cluster_kind_unless_it_says_namespaced() {
        let m = |kind: Option<&str>| Matcher {
            name: Some("x".into()),
            kind: kind.map(str::to_string),
            ..Matcher::default()
        };
        assert_eq!(
            Reference::Instancetype.kind(&m(None)).kind,
            "VirtualMachineClusterInstancetype"
        );
        assert_eq!(
            Reference::Instancetype
                .kind(&m(Some("VirtualMachineInstancetype")))
                .kind,
            "VirtualMachineInstancetype"
        );
        assert_eq!(
            Reference::Preference.kind(&m(None)).kind,
            "VirtualMachineClusterPreference"
        );
        assert_eq!(
            Reference::Preference
                .kind(&m(Some("virtualmachinepreference")))
                .kind,
            "VirtualMachinePreference"
        );
    }
}
