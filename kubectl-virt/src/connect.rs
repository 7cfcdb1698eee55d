//! Client configuration resolved the way kubectl resolves it: --kubeconfig,
//! else $KUBECONFIG (colon-separated list), else ~/.kube/config, else the
//! in-cluster service account.

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::error::{CliError, error_chain};

/// kubectl's connection flags.
#[derive(Clone, Debug, Default, clap::Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// Path to the kubeconfig file to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The name of the kubeconfig context to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The name of the kubeconfig cluster to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub cluster: Option<String>,
    /// The name of the kubeconfig user to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub user: Option<String>,
    /// The namespace scope for this request (default: the context's namespace, else "default").
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Username to impersonate for the operation (kubectl's --as).
    #[arg(long = "as", global = true, value_name = "USERNAME")]
    pub as_user: Option<String>,
    /// Group to impersonate for the operation (kubectl's --as-group). Repeatable.
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub as_group: Vec<String>,
}

/// A ready client plus what error messages need to know about it.
#[derive(Clone)]
pub struct Session {
    pub client: Client,
    pub namespace: String,
    /// API server URL, for "cannot reach" messages.
    pub server: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("namespace", &self.namespace)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// $KUBECONFIG read as kubectl reads it: a path list whose missing entries
/// are skipped (kube-rs fails on them), merged first-wins. `None` when the
/// variable is unset or names no existing file.
fn kubeconfig_from_env_list() -> Result<Option<Kubeconfig>, CliError> {
    let Some(value) = std::env::var_os("KUBECONFIG") else {
        return Ok(None);
    };
    let mut merged: Option<Kubeconfig> = None;
    for path in std::env::split_paths(&value).filter(|p| p.exists()) {
        let kc = Kubeconfig::read_from(&path).map_err(|e| {
            CliError::Config(format!("reading {}: {}", path.display(), error_chain(&e)))
        })?;
        merged = Some(match merged {
            None => kc,
            Some(m) => m.merge(kc).map_err(|e| {
                CliError::Config(format!("merging {}: {}", path.display(), error_chain(&e)))
            })?,
        });
    }
    Ok(merged)
}

impl GlobalArgs {
    fn options(&self) -> KubeConfigOptions {
        KubeConfigOptions {
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
        }
    }

    fn names_kubeconfig_entries(&self) -> bool {
        self.context.is_some() || self.cluster.is_some() || self.user.is_some()
    }

    /// Resolves the configuration without contacting the server.
    pub async fn config(&self) -> Result<Config, CliError> {
        let opts = self.options();
        if let Some(path) = &self.kubeconfig {
            let kc = Kubeconfig::read_from(path).map_err(|e| {
                CliError::Config(format!("reading {}: {}", path.display(), error_chain(&e)))
            })?;
            return Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|e| CliError::Config(format!("{}: {}", path.display(), error_chain(&e))));
        }
        if let Some(kc) = kubeconfig_from_env_list()? {
            return Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|e| CliError::Config(format!("$KUBECONFIG: {}", error_chain(&e))));
        }
        match Config::from_kubeconfig(&opts).await {
            Ok(c) => Ok(c),
            // An explicitly named context must come from a kubeconfig;
            // silently using the pod's service account instead would act
            // on the wrong cluster.
            Err(e) if self.names_kubeconfig_entries() => {
                Err(CliError::Config(error_chain(&e)))
            }
            Err(kc_err) => Config::incluster().map_err(|ic_err| {
                CliError::Config(format!(
                    "no usable kubeconfig ({}) and not running inside a cluster ({}); pass --kubeconfig or set KUBECONFIG",
                    error_chain(&kc_err),
                    error_chain(&ic_err)
                ))
            }),
        }
    }

    /// Applies --as/--as-group over what the kubeconfig says, as kubectl does.
    fn impersonate(&self, config: &mut Config) {
        if let Some(user) = &self.as_user {
            config.auth_info.impersonate = Some(user.clone());
        }
        if !self.as_group.is_empty() {
            config.auth_info.impersonate_groups = Some(self.as_group.clone());
        }
    }

    pub async fn session(&self) -> Result<Session, CliError> {
        let mut config = self.config().await?;
        self.impersonate(&mut config);
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        crate::request::validate_name("namespace", &namespace)?;
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config).map_err(|e| {
            CliError::Config(format!(
                "building a client for {server}: {}",
                error_chain(&e)
            ))
        })?;
        Ok(Session {
            client,
            namespace,
            server,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const KUBECONFIG: &str = r#"
apiVersion: v1
kind: Config
current-context: a
contexts:
- name: a
  context: {cluster: c1, user: u, namespace: team-a}
- name: b
  context: {cluster: c2, user: u}
clusters:
- name: c1
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
- name: c2
  cluster: {server: "https://127.0.0.2:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
"#;

    fn write_config() -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), KUBECONFIG).unwrap();
        f
    }

    #[tokio::test]
    async fn kubeconfig_flag_context_and_namespace() {
        let f = write_config();
        let g = GlobalArgs {
            kubeconfig: Some(f.path().to_owned()),
            ..GlobalArgs::default()
        };
        let s = g.session().await.unwrap();
        assert_eq!(s.namespace, "team-a");
        assert_eq!(s.server, "https://127.0.0.1:6443/");

        let g = GlobalArgs {
            kubeconfig: Some(f.path().to_owned()),
            context: Some("b".into()),
            ..GlobalArgs::default()
        };
        let s = g.session().await.unwrap();
        assert_eq!(s.namespace, "default");
        assert_eq!(s.server, "https://127.0.0.2:6443/");

        let g = GlobalArgs {
            kubeconfig: Some(f.path().to_owned()),
            namespace: Some("other".into()),
            ..GlobalArgs::default()
        };
        assert_eq!(g.session().await.unwrap().namespace, "other");

        let g = GlobalArgs {
            kubeconfig: Some(f.path().to_owned()),
            context: Some("missing".into()),
            ..GlobalArgs::default()
        };
        assert!(matches!(g.session().await, Err(CliError::Config(_))));
    }

    #[tokio::test]
    async fn as_and_as_group_impersonate() {
        let f = write_config();
        let g = GlobalArgs {
            kubeconfig: Some(f.path().to_owned()),
            as_user: Some("jane".into()),
            as_group: vec!["devs".into(), "ops".into()],
            ..GlobalArgs::default()
        };
        let mut c = g.config().await.unwrap();
        assert_eq!(c.auth_info.impersonate, None);
        g.impersonate(&mut c);
        assert_eq!(c.auth_info.impersonate.as_deref(), Some("jane"));
        assert_eq!(
            c.auth_info.impersonate_groups,
            Some(vec!["devs".to_string(), "ops".to_string()])
        );
    }

    #[tokio::test]
    async fn missing_kubeconfig_file_is_a_config_error() {
        let g = GlobalArgs {
            kubeconfig: Some("/nonexistent/kubeconfig".into()),
            ..GlobalArgs::default()
        };
        let e = g.session().await.unwrap_err();
        assert!(e.to_string().contains("/nonexistent/kubeconfig"), "{e}");
    }
}
