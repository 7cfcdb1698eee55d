//! Bridge between the REST layer and the field manager (server-side apply and
//! managedFields bookkeeping, in virt-apimachinery), so rest.rs stays independent of
//! its internals.

use serde_json::Value;
use virt_apimachinery::fieldmanager::{self, ApplyError, ListTypes, PathElement};

use crate::error::ApiError;
use crate::kinds::ResourceDef;
use crate::objects::{now_rfc3339, set_meta};

/// Field manager value meaning "keep the managedFields already on the object".
pub const KEEP_MANAGED: &str = "\u{0}keep-managed-fields";

/// An apply that could not be merged.
#[derive(Debug)]
pub struct ApplyFailure(pub ApplyError);

impl ApplyFailure {
    /// The Status error for the client: 409 with one cause per conflicting field.
    pub fn into_api_error(self, def: &ResourceDef, name: &str) -> ApiError {
        match &self.0 {
            ApplyError::Conflicts(_) => {
                let mut e = ApiError::conflict(
                    crate::error::Gr {
                        resource: def.plural,
                        group: def.group,
                    },
                    name,
                    "",
                );
                e.message = self.0.to_string();
                if let Some(d) = e.details.as_mut() {
                    d.causes = Some(self.0.causes());
                }
                e
            }
            ApplyError::Invalid(msg) => ApiError::bad_request(msg.clone()),
        }
    }
}

fn with_lists<T>(
    def: &ResourceDef,
    f: impl FnOnce(&dyn Fn(&[PathElement]) -> Option<Vec<String>>) -> T,
) -> T {
    let lists = ListTypes::cached(def.kind);
    let keys = |p: &[PathElement]| lists.and_then(|l| l.get(p));
    f(&keys)
}

/// Records an `Update` by `manager` from `old` to `new` in `new`'s managedFields.
pub fn record_update(
    def: &ResourceDef,
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
) {
    if manager == KEEP_MANAGED {
        return;
    }
    if manager.is_empty() {
        copy_managed_fields_from(old, new);
        return;
    }
    let now = now_rfc3339();
    let updated = with_lists(def, |keys| {
        fieldmanager::update(old, new, manager, subresource, &now, keys)
    });
    copy_managed_fields(&updated, new);
}

/// Merges an applied configuration into the live object (or creates it).
pub fn apply_to(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    def: &ResourceDef,
    subresource: Option<&str>,
) -> Result<Value, ApplyFailure> {
    let now = now_rfc3339();
    with_lists(def, |keys| {
        fieldmanager::apply_subresource(live, applied, manager, subresource, force, &now, keys)
    })
    .map_err(ApplyFailure)
}

/// Copies managedFields from `from` to `to`.
pub fn copy_managed_fields(from: &Value, to: &mut Value) {
    set_meta(
        to,
        "managedFields",
        from.pointer("/metadata/managedFields").cloned(),
    );
}

fn copy_managed_fields_from(from: Option<&Value>, to: &mut Value) {
    set_meta(
        to,
        "managedFields",
        from.and_then(|f| f.pointer("/metadata/managedFields"))
            .cloned(),
    );
}
