//! The authentication configuration kube-apiserver publishes for extension API servers
//! in `kube-system/extension-apiserver-authentication` (front-proxy CA, allowed names,
//! header names, client CA). Read at start-up and again every `--ca-reload-seconds`.

use k8s_openapi::api::core::v1::ConfigMap;

use crate::auth::{CaPool, RequestHeaderConfig};

/// What the ConfigMap provides.
#[derive(Debug, Clone, Default)]
pub struct Published {
    /// Front-proxy settings, when kube-apiserver has a request-header CA.
    pub request_header: Option<RequestHeaderConfig>,
    /// CA of x509 client-certificate users.
    pub client_ca: Option<CaPool>,
    /// The ConfigMap's data as read, to tell when it changed.
    pub source: String,
}

fn list(cm: &ConfigMap, key: &str, default: &[&str]) -> Vec<String> {
    cm.data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| serde_json::from_str::<Vec<String>>(v).ok())
        .unwrap_or_else(|| default.iter().map(|s| s.to_string()).collect())
}

/// Parses the ConfigMap's data (pure).
pub fn parse(cm: &ConfigMap) -> Published {
    let data = cm.data.clone().unwrap_or_default();
    let request_header = data
        .get("requestheader-client-ca-file")
        .and_then(|pem| CaPool::from_pem(pem.as_bytes()).ok())
        .map(|ca| RequestHeaderConfig {
            ca,
            allowed_names: list(cm, "requestheader-allowed-names", &[]),
            username_headers: list(cm, "requestheader-username-headers", &["X-Remote-User"]),
            group_headers: list(cm, "requestheader-group-headers", &["X-Remote-Group"]),
            extra_prefixes: list(
                cm,
                "requestheader-extra-headers-prefix",
                &["X-Remote-Extra-"],
            ),
        });
    let client_ca = data
        .get("client-ca-file")
        .and_then(|pem| CaPool::from_pem(pem.as_bytes()).ok());
    Published {
        request_header,
        client_ca,
        source: serde_json::to_string(&data).unwrap_or_default(),
    }
}

/// Reads the ConfigMap; `None` (logged) when it is absent or unreadable.
pub async fn read_published(client: kube::Client) -> Option<Published> {
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "kube-system");
    match api.get_opt("extension-apiserver-authentication").await {
        Ok(Some(cm)) => Some(parse(&cm)),
        Ok(None) => {
            tracing::warn!(
                "kube-system/extension-apiserver-authentication not found: front-proxy authentication disabled"
            );
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "Cannot read kube-system/extension-apiserver-authentication; bind the extension-apiserver-authentication-reader Role");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_keys_disable_request_header() {
        let p = parse(&ConfigMap::default());
        assert!(p.request_header.is_none() && p.client_ca.is_none());
    }

    #[test]
    fn lists_are_json_encoded() {
        let cm = ConfigMap {
            data: Some(
                [(
                    "requestheader-allowed-names".to_string(),
                    "[\"front-proxy-client\"]".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        };
        assert_eq!(
            list(&cm, "requestheader-allowed-names", &[]),
            vec!["front-proxy-client"]
        );
        assert_eq!(
            list(&cm, "requestheader-username-headers", &["X-Remote-User"]),
            vec!["X-Remote-User"]
        );
    }
}
