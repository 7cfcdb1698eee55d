//! The request bodies of the action subresources (KubeVirt's `StartOptions`, … of
//! `kubevirt.io/api/core/v1`, field for field): one type each for the server that decodes
//! them and the plugin that sends them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `dryRun: ["All"]`, the only value Kubernetes defines.
pub const DRY_RUN_ALL: &str = "All";

/// `Some(["All"])` when `on`.
pub fn dry_run_all(on: bool) -> Option<Vec<String>> {
    on.then(|| vec![DRY_RUN_ALL.to_string()])
}

/// Whether a `dryRun` field asks for a dry run; an error naming the values otherwise.
pub fn is_dry_run(d: Option<&[String]>) -> Result<bool, String> {
    match d {
        None | Some([]) => Ok(false),
        Some([x]) if x == DRY_RUN_ALL => Ok(true),
        Some(other) => Err(format!(
            "invalid dryRun value {other:?}: supported value is [\"All\"]"
        )),
    }
}

/// Body of `start`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartOptions {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

/// Body of `stop`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StopOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

/// Body of `restart`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestartOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

/// Body of `migrate`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrateOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_node_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

/// Body of `pause` and `unpause` (KubeVirt's PauseOptions and UnpauseOptions have this one
/// shape), and what `softreboot` accepts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

/// Body of `evacuate/cancel` (KubeVirt's EvacuateCancelOptions).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvacuateCancelOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_round_trip_in_kubevirts_field_names() {
        let s = StopOptions {
            grace_period: Some(0),
            dry_run: dry_run_all(true),
        };
        let v = serde_json::to_value(&s).unwrap_or_default();
        assert_eq!(v, serde_json::json!({"gracePeriod": 0, "dryRun": ["All"]}));
        assert_eq!(serde_json::from_value::<StopOptions>(v).ok(), Some(s));
        assert_eq!(
            serde_json::to_value(StartOptions::default()).unwrap_or_default(),
            serde_json::json!({})
        );
        assert_eq!(is_dry_run(Some(&["All".to_string()])), Ok(true));
        assert!(is_dry_run(Some(&["x".to_string()])).is_err());
    }
}
