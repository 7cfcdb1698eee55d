//! A real etcd and kube-apiserver for integration tests that need what only kube-apiserver
//! does (pod validation, graceful deletion, binding and eviction, garbage collection
//! semantics, APIService objects): virt-controller's and virt-operator's.
//!
//! Each [`KubeApi`] is its own etcd and kube-apiserver on free loopback ports (static token,
//! AlwaysAllow or RBAC, no controller-manager, scheduler or kubelet: tests play their parts),
//! stopped on drop.
//!
//! kube-apiserver: `$KUBE_APISERVER_BIN` (set by `cargo xtask test`), else
//! `target/k8s/*/bin/kube-apiserver`, which `cargo xtask cluster up` builds. etcd: Debian's
//! `etcd-server`, started by [`virt_devenv::Etcd`] with the same flags as a DevEnv's.

// A test helper: a failure to start is the test's failure, with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};

/// The kube-apiserver binary the tests run.
pub fn kube_apiserver_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("KUBE_APISERVER_BIN") {
        return p.into();
    }
    let k8s = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/k8s");
    let found = std::fs::read_dir(&k8s).ok().and_then(|versions| {
        versions
            .filter_map(Result::ok)
            .map(|v| v.path().join("bin/kube-apiserver"))
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!(
            "no kube-apiserver under {}: run `cargo xtask cluster up` once (it builds the \
             Kubernetes binaries), or set KUBE_APISERVER_BIN",
            k8s.display()
        )
    })
}

/// A child process killed on drop.
#[derive(Debug)]
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How to start a [`KubeApi`] beyond its admin token.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// RBAC instead of AlwaysAllow (the token's user, in `system:masters`, may still do
    /// anything).
    pub rbac: bool,
    /// The kube-apiserver binary; [`kube_apiserver_bin`] when `None`.
    pub kube_apiserver_bin: Option<PathBuf>,
    /// More kube-apiserver flags, e.g. the aggregation layer's (`--proxy-client-cert-file`,
    /// `--requestheader-*`, `--enable-aggregator-routing`).
    pub extra_args: Vec<String>,
}

/// etcd + kube-apiserver, stopped on drop.
pub struct KubeApi {
    // Field order = drop order: the apiserver stops before its etcd, the dir goes last.
    apiserver: Proc,
    etcd: virt_devenv::Etcd,
    /// Logs (`etcd.log`, `kube-apiserver.log`) and data.
    pub dir: tempfile::TempDir,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// An admin client (`system:masters`).
    pub client: Client,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApi")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl KubeApi {
    /// Starts etcd and kube-apiserver with an admin `token` and waits until kube-apiserver is
    /// ready and has created its system namespaces (`kube-system` appears just after
    /// `/readyz`).
    pub async fn start(token: &str) -> Self {
        Self::start_with(token, Options::default()).await
    }

    /// [`KubeApi::start`] with RBAC authorization, for tests that need a SubjectAccessReview
    /// to deny (the `token` user is in `system:masters` and still may do anything).
    pub async fn start_rbac(token: &str) -> Self {
        Self::start_with(
            token,
            Options {
                rbac: true,
                ..Options::default()
            },
        )
        .await
    }

    /// [`KubeApi::start`] with `opts`.
    pub async fn start_with(token: &str, opts: Options) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let etcd = virt_devenv::Etcd::start(Path::new("/usr/bin/etcd"), d)
            .expect("start etcd (install Debian's etcd-server)");
        let api_port = virt_devenv::free_port().unwrap();
        let key = d.join("sa.key");
        let ok = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048")
            .stderr(Stdio::null())
            .status()
            .expect("openssl");
        assert!(ok.success(), "openssl genrsa failed");
        std::fs::write(
            d.join("tokens.csv"),
            format!("{token},admin,admin-uid,system:masters\n"),
        )
        .unwrap();
        let bin = opts.kube_apiserver_bin.unwrap_or_else(kube_apiserver_bin);
        let authorization_mode = if opts.rbac { "RBAC" } else { "AlwaysAllow" };
        let apiserver = Proc(
            Command::new(bin)
                .args(["--etcd-servers", &etcd.url])
                .args(["--bind-address", "127.0.0.1"])
                .args(["--secure-port", &api_port.to_string()])
                .arg("--cert-dir")
                .arg(d.join("certs"))
                .arg("--token-auth-file")
                .arg(d.join("tokens.csv"))
                .args(["--authorization-mode", authorization_mode])
                // Launcher pods are privileged.
                .arg("--allow-privileged=true")
                .args(["--service-account-issuer", "https://kubernetes.default.svc"])
                .arg("--service-account-key-file")
                .arg(&key)
                .arg("--service-account-signing-key-file")
                .arg(&key)
                .args(["--service-cluster-ip-range", "10.0.0.0/24"])
                // No kubernetes Service endpoints: nothing here runs in a pod.
                .args(["--endpoint-reconciler-type", "none"])
                .args(&opts.extra_args)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(d.join("kube-apiserver.log")).unwrap())
                .spawn()
                .expect("start kube-apiserver"),
        );
        let kubeconfig = d.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: t\n\
                 clusters: [{{name: t, cluster: {{server: 'https://127.0.0.1:{api_port}', insecure-skip-tls-verify: true}}}}]\n\
                 users: [{{name: t, user: {{token: {token}}}}}]\n\
                 contexts: [{{name: t, context: {{cluster: t, user: t}}}}]\n"
            ),
        )
        .unwrap();
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let client = Client::try_from(cfg).unwrap();
        let api = Self {
            apiserver,
            etcd,
            dir,
            url: format!("https://127.0.0.1:{api_port}"),
            client,
        };
        api.wait_ready().await;
        api
    }

    /// kube-apiserver's process id, for /proc.
    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver.0.id()
    }

    /// Its etcd's process id.
    pub fn etcd_pid(&self) -> u32 {
        self.etcd.pid()
    }

    /// Whether kube-apiserver and its etcd still run.
    pub fn alive(&mut self) -> bool {
        matches!(self.apiserver.0.try_wait(), Ok(None)) && self.etcd.alive()
    }

    /// Its etcd's client URL (`/metrics` is served there too).
    pub fn etcd_url(&self) -> &str {
        &self.etcd.url
    }

    async fn wait_ready(&self) {
        let log = self.dir.path().join("kube-apiserver.log");
        eventually(
            &format!("kube-apiserver ready (log: {})", log.display()),
            // About 10 s alone; on a 2-CPU machine loaded with builds and other test
            // binaries it has taken over a minute.
            Duration::from_secs(120),
            || async {
                let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
                self.client.request_text(req).await.ok()
            },
        )
        .await;
        eventually(
            "namespace kube-system created by kube-apiserver",
            Duration::from_secs(60),
            || async {
                Api::<Namespace>::all(self.client.clone())
                    .get_opt("kube-system")
                    .await
                    .ok()
                    .flatten()
            },
        )
        .await;
    }
}

/// Polls `f` until it returns Some, for at most `timeout`; panics naming `what` after that.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} not reached within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
