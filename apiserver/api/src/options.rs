//! The request bodies of the action subresources (KubeVirt's `StartOptions`, … of
//! `kubevirt.io/api/core/v1`, field for field): one type each for the server that decodes
//! them and the plugin that sends them.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
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

/// Why an options body was refused (a 400).
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// Not JSON of the options type (KubeVirt's wording).
    #[error("Can not unmarshal Request body to struct, error: {0}")]
    Decode(#[from] serde_json::Error),
    /// Decoded, but a value is not allowed.
    #[error("{0}")]
    Invalid(String),
}

/// Decodes an options body; an empty one (clients may send none) is the type's default.
pub fn decode<T: Default + DeserializeOwned>(body: &[u8]) -> Result<T, OptionsError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    Ok(serde_json::from_slice(body)?)
}

/// The dry-run flag of a body that carries only `dryRun` (`PauseOptions`' shape).
pub fn decode_dry_run(body: &[u8]) -> Result<bool, OptionsError> {
    let o: PauseOptions = decode(body)?;
    is_dry_run(o.dry_run.as_deref()).map_err(OptionsError::Invalid)
}

/// Options of the start action.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartOptions {
    /// Start the guest paused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// When present, the request is validated and not acted on. The only valid value is All.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

/// Options of the stop action.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StopOptions {
    /// Seconds the guest gets to shut down; overrides terminationGracePeriodSeconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<i64>,
    /// When present, the request is validated and not acted on. The only valid value is All.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

/// Options of the restart action.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestartOptions {
    /// Seconds the guest gets to shut down before it is restarted; 0 forces an immediate restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<i64>,
    /// When present, the request is validated and not acted on. The only valid value is All.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

/// Options of the migrate action.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrateOptions {
    /// Node labels the migration target must have in addition to the VMI's nodeSelector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_node_selector: Option<BTreeMap<String, String>>,
    /// When present, the request is validated and not acted on. The only valid value is All.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

/// Options of the pause action.
// KubeVirt's PauseOptions and UnpauseOptions have this one shape; softreboot and reset
// accept it too.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PauseOptions {
    /// When present, the request is validated and not acted on. The only valid value is All.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

/// Options of the freeze action.
// KubeVirt's FreezeUnfreezeTimeout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FreezeUnfreezeTimeout {
    /// How long the guest's file systems stay frozen at most: they are thawed after it unless
    /// unfreeze came first. A Go duration (`5m0s`); `0s` keeps them frozen until unfreeze.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfreeze_timeout: Option<String>,
}

/// Options of the evacuate/cancel action.
// KubeVirt's EvacuateCancelOptions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvacuateCancelOptions {
    /// When present, the request is validated and not acted on. The only valid value is All.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<Vec<String>>,
}

/// The OpenAPI kinds of the options bodies (the catalogue's `Style::Action { options }`).
pub const KINDS: [&str; 10] = [
    "StartOptions",
    "StopOptions",
    "RestartOptions",
    "MigrateOptions",
    "PauseOptions",
    "UnpauseOptions",
    "EvacuateCancelOptions",
    "FreezeUnfreezeTimeout",
    "AddVolumeOptions",
    "RemoveVolumeOptions",
];

/// The schema of the options kind `kind` (one of [`KINDS`]) as `settings` generate it: what
/// OpenAPI publishes is the type the server decodes and the plugin sends.
pub fn root_schema(
    kind: &str,
    settings: schemars::generate::SchemaSettings,
) -> Option<schemars::Schema> {
    let g = settings.into_generator();
    Some(match kind {
        "StartOptions" => g.into_root_schema_for::<StartOptions>(),
        "StopOptions" => g.into_root_schema_for::<StopOptions>(),
        "RestartOptions" => g.into_root_schema_for::<RestartOptions>(),
        "MigrateOptions" => g.into_root_schema_for::<MigrateOptions>(),
        "PauseOptions" => g.into_root_schema_for::<PauseOptions>(),
        "UnpauseOptions" => {
            let mut s = g.into_root_schema_for::<PauseOptions>();
            s.insert(
                "description".into(),
                "Options of the unpause action.".into(),
            );
            s
        }
        "EvacuateCancelOptions" => g.into_root_schema_for::<EvacuateCancelOptions>(),
        "FreezeUnfreezeTimeout" => g.into_root_schema_for::<FreezeUnfreezeTimeout>(),
        "AddVolumeOptions" => g.into_root_schema_for::<crate::hotplug::AddVolumeOptions>(),
        "RemoveVolumeOptions" => g.into_root_schema_for::<crate::hotplug::RemoveVolumeOptions>(),
        _ => return None,
    })
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

    #[test]
    fn empty_bodies_are_defaults_and_bad_ones_say_why() {
        assert!(matches!(decode_dry_run(b""), Ok(false)));
        assert!(matches!(decode_dry_run(b" \n"), Ok(false)));
        assert!(matches!(decode_dry_run(br#"{"dryRun":["All"]}"#), Ok(true)));
        let e = decode_dry_run(b"{").map(drop).err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.starts_with("Can not unmarshal Request body to struct, error: ")),
            "{e:?}"
        );
        let e = decode_dry_run(br#"{"dryRun":["x"]}"#).map(drop).err();
        assert!(matches!(e, Some(OptionsError::Invalid(_))), "{e:?}");
    }
}
