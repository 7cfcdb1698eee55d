//! The Kubernetes client every controller binary (virt-controller, virt-operator) starts with,
//! its requests counted in KubeVirt's REST client metrics ([`kube_client_metrics`]).

use std::path::Path;

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error("loading kubeconfig: {0}")]
    Load(#[from] kube::config::KubeconfigError),
    #[error("no kube-apiserver configuration: {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("building client: {0}")]
    Build(#[from] kube::Error),
}

/// A client from `kubeconfig` when given, else the in-cluster or default configuration.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    match kubeconfig {
        Some(path) => {
            let kc =
                kube::config::Kubeconfig::read_from(path).map_err(|source| ClientError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            Ok(kube_client_metrics::client(cfg)?)
        }
        None => Ok(kube_client_metrics::client(kube::Config::infer().await?)?),
    }
}
