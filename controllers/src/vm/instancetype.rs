//! A VM's instance type and preference (`instancetype.kubevirt.io`), as KubeVirt's VM
//! controller handles them: the copy of each the VM uses is captured once in a
//! ControllerRevision (kube-apiserver; one per copied generation and namespace, shared by the
//! VMs that captured it, each an owner, so the garbage collector deletes it with the last of
//! them) and named in the VM's status; the VMIs of the VM are made from those copies,
//! so a later change or deletion of the instance type leaves the VM as it was; under
//! `referencePolicy: expand|expandAll` the VM's spec is rewritten instead.
//!
//! The decisions are pure (`kubevirt_api::instancetype::{vm, revision}`); this module only
//! reads and writes: the referenced objects (through the aggregated API), the revisions.
//! Cost per VM: one read per reference and one revision create (or, when another VM made it,
//! a read and an owner patch), once, when the VM is first seen; one revision read per reference when a VMI is created from a copy captured earlier.
//! Status-only reconciles read nothing.

use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    PostParams, Preconditions,
};
use kube::{Client, ResourceExt};
use kubevirt_api::catalogue::Kind;
use kubevirt_api::instancetype::reference::Reference;
use kubevirt_api::instancetype::revision::{self, RevisionError};
use kubevirt_api::instancetype::vm::{Specs, captured_revision, sync_status_ref};
use kubevirt_api::instancetype::{VirtualMachineInstancetypeSpec, VirtualMachinePreferenceSpec};
use kubevirt_api::vm::InstancetypeStatusRef;
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};
use serde_json::Value;

use crate::context::FIELD_MANAGER;

/// Why a VM's instance type or preference could not be captured or used.
#[derive(Debug, thiserror::Error)]
pub enum InstancetypeError {
    /// The referenced object does not exist (and no copy was captured).
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// Its kind.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The captured copy is gone.
    #[error("ControllerRevision {0:?} holding the VM's copy not found")]
    RevisionNotFound(String),
    /// A reference without a name (an `inferFromVolume` virt-apiserver did not resolve).
    #[error("{0} names no object")]
    Unnamed(&'static str),
    /// Reading an object failed.
    #[error("reading {what}: {source}")]
    Read {
        /// What was read.
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Creating the revision failed.
    #[error("creating ControllerRevision {name}: {source}")]
    Create {
        /// The revision.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A revision of the expected name holds another copy (KubeVirt's error).
    #[error("found existing ControllerRevision with unexpected data: {0}")]
    OtherCopy(String),
    /// The revision to share is being deleted (its last owner went): the next reconcile
    /// makes it again.
    #[error("ControllerRevision {0:?} is being deleted")]
    Deleting(String),
    /// Adding the VM to a shared revision's owners, or removing it, failed.
    #[error("changing the owners of ControllerRevision {name}: {source}")]
    Owners {
        /// The revision.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The revision cannot be made, or holds something else.
    #[error(transparent)]
    Revision(#[from] RevisionError),
    /// The copy does not decode as its kind's spec.
    #[error("decoding the {what}: {message}")]
    Decode {
        /// What was decoded.
        what: &'static str,
        /// The error.
        message: String,
    },
    /// The VM's template conflicts with its instance type (KubeVirt's message).
    #[error("VMI conflicts with instancetype spec in fields: [{0}]")]
    Conflicts(String),
}

impl InstancetypeError {
    /// KubeVirt's Event reason for the failure.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { kind, .. } if kind.contains("Preference") => "FailedFindPreference",
            Self::NotFound { .. } => "FailedFindInstancetype",
            _ => "FailedCreate",
        }
    }
}

/// What a VM uses after [`capture`]: its status references and the copies captured by
/// this reconcile (the others are read from their revisions when needed).
#[derive(Clone, Debug, Default)]
pub struct Captured {
    /// `status.instancetypeRef`.
    pub instancetype_ref: Option<InstancetypeStatusRef>,
    /// `status.preferenceRef`.
    pub preference_ref: Option<InstancetypeStatusRef>,
    instancetype_spec: Option<Value>,
    preference_spec: Option<Value>,
}

impl Captured {
    /// Writes the references into `vm`'s status (the status write of the reconcile carries
    /// them: no write of its own).
    pub fn set_refs(&self, vm: &mut VirtualMachine) {
        let status = vm.status.get_or_insert_with(Default::default);
        status.instancetype_ref = self.instancetype_ref.clone();
        status.preference_ref = self.preference_ref.clone();
    }

    fn slot(
        &mut self,
        which: Reference,
    ) -> (&mut Option<InstancetypeStatusRef>, &mut Option<Value>) {
        match which {
            Reference::Instancetype => (&mut self.instancetype_ref, &mut self.instancetype_spec),
            Reference::Preference => (&mut self.preference_ref, &mut self.preference_spec),
        }
    }
}

/// Whether the VM references an instance type or a preference.
pub fn uses_instancetype(vm: &VirtualMachine) -> bool {
    vm.spec.instancetype.is_some() || vm.spec.preference.is_some()
}

fn api_resource(kind: &Kind) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(kind.group, kind.version, kind.kind),
        kind.plural,
    )
}

/// The referenced object as stored, or `None`.
async fn read_object(
    client: &Client,
    kind: &'static Kind,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>, InstancetypeError> {
    let ar = api_resource(kind);
    let api: Api<DynamicObject> = if kind.namespaced {
        Api::namespaced_with(client.clone(), namespace, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    };
    let found = api
        .get_opt(name)
        .await
        .map_err(|source| InstancetypeError::Read {
            what: format!("{} {name}", kind.kind),
            source,
        })?;
    found
        .map(|o| {
            serde_json::to_value(o).map_err(|e| InstancetypeError::Decode {
                what: kind.kind,
                message: e.to_string(),
            })
        })
        .transpose()
}

/// Our writes, as virt-controller's field manager.
fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    }
}

/// Creates the revision, or finds it made by an earlier attempt or another VM with the same
/// copy and adds the VM (`vm_name`, `vm_uid`) to its owners. Returns the name of the revision
/// the VM uses: the shared one, or — when the shared one refuses another owner (a copy whose
/// `data` kube-apiserver re-encodes differently, e.g. one written before its keys were
/// ordered) — the VM's own, as KubeVirt would have made it.
async fn store_revision(
    revisions: &Api<ControllerRevision>,
    desired: &ControllerRevision,
    vm_name: &str,
    vm_uid: &str,
) -> Result<String, InstancetypeError> {
    let name = desired.name_any();
    let Some(existing) = create_or_find(revisions, desired).await? else {
        return Ok(name);
    };
    if existing.metadata.deletion_timestamp.is_some() {
        return Err(InstancetypeError::Deleting(name));
    }
    if revision::owned_by(&existing, vm_uid) {
        return Ok(name);
    }
    let pp = patch_params();
    match revisions
        .patch(
            &name,
            &pp,
            &Patch::Strategic(revision::add_owner_patch(vm_name, vm_uid)),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(revision = %name, "sharing another VM's copy");
            Ok(name)
        }
        Err(kube::Error::Api(s)) if s.code == 422 => {
            let mut own = desired.clone();
            let own_name = revision::own_revision_name(vm_name, &name);
            tracing::warn!(revision = %name, own = %own_name, message = %s.message,
                "the shared copy takes no other owner: the VM gets its own");
            own.metadata.name = Some(own_name.clone());
            create_or_find(revisions, &own).await?;
            Ok(own_name)
        }
        Err(source) => Err(InstancetypeError::Owners { name, source }),
    }
}

/// Creates `desired`; `None` when created, else the revision of that name made earlier,
/// if it holds the same copy.
async fn create_or_find(
    revisions: &Api<ControllerRevision>,
    desired: &ControllerRevision,
) -> Result<Option<ControllerRevision>, InstancetypeError> {
    let name = desired.name_any();
    let params = post_params();
    match revisions.create(&params, desired).await {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            let existing =
                revisions
                    .get(&name)
                    .await
                    .map_err(|source| InstancetypeError::Read {
                        what: format!("ControllerRevision {name}"),
                        source,
                    })?;
            if revision::same_copy(desired, &existing) {
                Ok(Some(existing))
            } else {
                Err(InstancetypeError::OtherCopy(name))
            }
        }
        Err(source) => Err(InstancetypeError::Create { name, source }),
    }
}

/// Drops the VM's claim on a revision: the last owner deletes it (only if no VM added
/// itself since it was read: the deletion is conditional on that version), any other
/// removes its ownerReference. An owner that is gone is dropped by the garbage collector
/// the same way.
async fn release_revision(
    revisions: &Api<ControllerRevision>,
    name: &str,
    vm_uid: &str,
) -> Result<(), InstancetypeError> {
    let owners_error = |source| InstancetypeError::Owners {
        name: name.to_string(),
        source,
    };
    for _ in 0..3 {
        let Some(r) = revisions
            .get_opt(name)
            .await
            .map_err(|source| InstancetypeError::Read {
                what: format!("ControllerRevision {name}"),
                source,
            })?
        else {
            return Ok(());
        };
        if !revision::other_owners(&r, vm_uid).is_empty() {
            if revision::owned_by(&r, vm_uid) {
                let pp = patch_params();
                revisions
                    .patch(
                        name,
                        &pp,
                        &Patch::Strategic(revision::remove_owner_patch(vm_uid)),
                    )
                    .await
                    .map_err(owners_error)?;
            }
            return Ok(());
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: r.metadata.resource_version.clone(),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match revisions.delete(name, &dp).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
            // Another VM added itself since the read: look again.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(owners_error(e)),
        }
    }
    // Still contended after three rounds: the garbage collector drops the reference once
    // the VM is gone.
    Ok(())
}

/// Captures what the VM references and has no copy of yet (KubeVirt's `Store`): reads the
/// object, stores its copy, names it in the references returned. A VM whose references all
/// have copies costs nothing here.
pub async fn capture(client: &Client, vm: &VirtualMachine) -> Result<Captured, InstancetypeError> {
    let namespace = vm.namespace().unwrap_or_default();
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), &namespace);
    let mut out = Captured::default();
    for which in [Reference::Instancetype, Reference::Preference] {
        let Some(m) = which.matcher(vm) else {
            continue;
        };
        let mut r = sync_status_ref(m, which.status_ref(vm));
        if r.controller_revision_ref.is_none() {
            let name = m
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .ok_or(InstancetypeError::Unnamed(which.field()))?;
            let kind = which.kind(m);
            let object = read_object(client, kind, &namespace, &name).await?.ok_or(
                InstancetypeError::NotFound {
                    kind: kind.kind,
                    name: name.clone(),
                },
            )?;
            let desired = revision::controller_revision(
                &vm.name_any(),
                vm.metadata.uid.as_deref().unwrap_or_default(),
                &namespace,
                kind.kind,
                &object,
            )?;
            let stored = store_revision(
                &revisions,
                &desired,
                &vm.name_any(),
                vm.metadata.uid.as_deref().unwrap_or_default(),
            )
            .await?;
            tracing::info!(revision = %stored, reference = which.field(), "captured the VM's copy");
            r.controller_revision_ref =
                Some(kubevirt_api::vm::ControllerRevisionRef { name: Some(stored) });
            *out.slot(which).1 = object.get("spec").cloned();
        }
        *out.slot(which).0 = Some(r);
    }
    Ok(out)
}

/// The specs the VM uses: the copies captured by this reconcile, else those its status
/// names (read from their revisions), else — a VM never captured, under an expand policy —
/// the referenced objects.
pub async fn specs(
    client: &Client,
    vm: &VirtualMachine,
    captured: &Captured,
) -> Result<Specs, InstancetypeError> {
    let namespace = vm.namespace().unwrap_or_default();
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), &namespace);
    let mut specs = Specs::default();
    for which in [Reference::Instancetype, Reference::Preference] {
        let Some(m) = which.matcher(vm) else {
            continue;
        };
        let (r, now) = match which {
            Reference::Instancetype => (&captured.instancetype_ref, &captured.instancetype_spec),
            Reference::Preference => (&captured.preference_ref, &captured.preference_spec),
        };
        let name = m.name.clone().unwrap_or_default();
        let mut spec = now.clone();
        if spec.is_none()
            && let Some(rev) = captured_revision(r.as_ref().or(which.status_ref(vm)))
        {
            let found =
                match revisions
                    .get_opt(rev)
                    .await
                    .map_err(|source| InstancetypeError::Read {
                        what: format!("ControllerRevision {rev}"),
                        source,
                    })? {
                    Some(found) => found,
                    None => recapture(client, &revisions, vm, which, rev).await?,
                };
            // KubeVirt's check: a revision copying another object than the one named now
            // (a hand-set revisionName) is not used.
            if revision::copies(&found, &name) {
                spec = Some(which.revision_spec(&found)?);
            }
        }
        let spec = match spec {
            Some(s) => s,
            None => {
                if name.is_empty() {
                    return Err(InstancetypeError::Unnamed(which.field()));
                }
                let kind = which.kind(m);
                read_object(client, kind, &namespace, &name)
                    .await?
                    .and_then(|o| o.get("spec").cloned())
                    .ok_or(InstancetypeError::NotFound {
                        kind: kind.kind,
                        name,
                    })?
            }
        };
        match which {
            Reference::Instancetype => {
                specs.instancetype = Some(decode::<VirtualMachineInstancetypeSpec>(
                    spec,
                    "instance type",
                )?)
            }
            Reference::Preference => {
                specs.preference = Some(decode::<VirtualMachinePreferenceSpec>(spec, "preference")?)
            }
        }
    }
    Ok(specs)
}

/// The revision `rev` the VM's status names is gone: made again from the referenced object
/// if that is still the copied generation (a revision deleted by hand, or by the garbage
/// collector between its last owner's deletion and this VM's owner patch), else
/// [`InstancetypeError::RevisionNotFound`]: the copy is lost, as in KubeVirt.
async fn recapture(
    client: &Client,
    revisions: &Api<ControllerRevision>,
    vm: &VirtualMachine,
    which: Reference,
    rev: &str,
) -> Result<ControllerRevision, InstancetypeError> {
    let lost = || InstancetypeError::RevisionNotFound(rev.to_string());
    let Some(m) = which.matcher(vm) else {
        return Err(lost());
    };
    let Some(name) = m.name.clone().filter(|n| !n.is_empty()) else {
        return Err(lost());
    };
    let namespace = vm.namespace().unwrap_or_default();
    let kind = which.kind(m);
    let Some(object) = read_object(client, kind, &namespace, &name).await? else {
        return Err(lost());
    };
    if !revision::is_current_copy(rev, &object) {
        return Err(lost());
    }
    let desired = revision::controller_revision(
        &vm.name_any(),
        vm.metadata.uid.as_deref().unwrap_or_default(),
        &namespace,
        kind.kind,
        &object,
    )?;
    // Made under the name the VM's status gives (shared: a function of the copy), so the
    // VM's references stay as they are.
    let mut desired = desired;
    desired.metadata.name = Some(rev.to_string());
    let vm_uid = vm.metadata.uid.as_deref().unwrap_or_default();
    if let Some(existing) = create_or_find(revisions, &desired).await?
        && !revision::owned_by(&existing, vm_uid)
    {
        // Another VM made it again first: share it (the collector keeps it while either
        // owns it; without this VM's reference it would go with the other VM).
        let pp = patch_params();
        revisions
            .patch(
                rev,
                &pp,
                &Patch::Strategic(revision::add_owner_patch(&vm.name_any(), vm_uid)),
            )
            .await
            .map_err(|source| InstancetypeError::Owners {
                name: rev.to_string(),
                source,
            })?;
    }
    tracing::warn!(
        revision = rev,
        "the VM's copy was gone; made again from the unchanged {}",
        kind.kind
    );
    Ok(desired)
}

fn decode<T: serde::de::DeserializeOwned>(
    v: Value,
    what: &'static str,
) -> Result<T, InstancetypeError> {
    serde_json::from_value(v).map_err(|e| InstancetypeError::Decode {
        what,
        message: e.to_string(),
    })
}

/// Applies `specs` to the VMI rendered for `vm` (pure; KubeVirt's order and messages).
pub fn apply(
    vm: &VirtualMachine,
    specs: &Specs,
    vmi: &mut VirtualMachineInstance,
) -> Result<(), InstancetypeError> {
    let mut annotations = vmi.metadata.annotations.clone().unwrap_or_default();
    let errs =
        kubevirt_api::instancetype::vm::apply_to_vmi(vm, specs, &mut vmi.spec, &mut annotations);
    if !errs.is_empty() {
        let fields: Vec<String> = errs.iter().map(|e| e.field.clone()).collect();
        return Err(InstancetypeError::Conflicts(fields.join(", ")));
    }
    vmi.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    Ok(())
}

/// `referencePolicy: expand|expandAll` (KubeVirt's `handleExpand`): the VM as stored now,
/// its instance type and preference written into its template, both references and the
/// status' references dropped; then the copies it had are deleted. Returns whether the VM
/// was rewritten (false: it no longer references either, or another write came first and
/// the next reconcile does it).
pub async fn expand(client: &Client, vm: &VirtualMachine) -> Result<bool, InstancetypeError> {
    let namespace = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &namespace);
    let Some(current) = vms
        .get_opt(&name)
        .await
        .map_err(|source| InstancetypeError::Read {
            what: format!("VirtualMachine {name}"),
            source,
        })?
    else {
        return Ok(false);
    };
    if !uses_instancetype(&current) {
        return Ok(false);
    }
    let specs = specs(client, &current, &Captured::default()).await?;
    let expanded = kubevirt_api::instancetype::vm::expand(&current, &specs).map_err(|errs| {
        InstancetypeError::Conflicts(
            errs.iter()
                .map(|e| e.field.clone())
                .collect::<Vec<_>>()
                .join(", "),
        )
    })?;
    let params = post_params();
    // A PUT of the whole VM carries the resourceVersion read: a concurrent change makes
    // it 409 and the next reconcile expands the newer VM.
    let written = match vms.replace(&name, &params, &expanded).await {
        Ok(w) => w,
        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(false),
        Err(source) => {
            return Err(InstancetypeError::Create {
                name: format!("VirtualMachine {name}"),
                source,
            });
        }
    };
    let status_patch = serde_json::json!({
        "metadata": {"resourceVersion": written.metadata.resource_version},
        "status": {"instancetypeRef": null, "preferenceRef": null},
    });
    let pp = patch_params();
    if let Err(e) = vms
        .patch_status(&name, &pp, &kube::api::Patch::Merge(&status_patch))
        .await
    {
        // The spec no longer references anything: the next capture finds nothing to keep.
        tracing::debug!(error = %e, "clearing the expanded VM's references");
    }
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), &namespace);
    let vm_uid = current.metadata.uid.as_deref().unwrap_or_default();
    for which in [Reference::Instancetype, Reference::Preference] {
        if let Some(rev) = captured_revision(which.status_ref(&current))
            && let Err(e) = release_revision(&revisions, rev, vm_uid).await
        {
            // The garbage collector drops the VM's reference when the VM goes anyway.
            tracing::warn!(revision = rev, error = %e, "releasing an expanded VM's copy");
        }
    }
    tracing::info!(vm = %name, "expanded the instance type and preference into the VM");
    Ok(true)
}
