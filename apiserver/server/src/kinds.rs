//! The kinds this server stores: each kind's strategy (`kubevirt_api::kinds`) is what the
//! REST logic, watches, tables, discovery and backups ask about it, so nothing here names a
//! kind.

use serde_json::{Value, json};

pub use kubevirt_api::catalogue::Column;
/// A stored kind's strategy.
pub use kubevirt_api::kinds::KindStrategy as ResourceDef;

/// A placeholder for an empty status, so `status: {}` reads the same as no status.
pub fn empty_status() -> Value {
    json!({})
}
