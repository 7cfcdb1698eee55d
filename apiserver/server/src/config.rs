//! Command line and validated configuration of virt-apiserver.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// virt-apiserver command line.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "virt-apiserver",
    about = "Aggregated API server for kubevirt.io/v1",
    version
)]
pub struct Args {
    /// Address to serve HTTPS on.
    #[arg(long, env = "VIRT_APISERVER_BIND", default_value = "127.0.0.1:8443")]
    pub bind: SocketAddr,
    /// Address of a plain-HTTP listener serving only `/metrics` and `/healthz`, for
    /// Prometheus as virt-controller's and virt-handler's: KubeVirt's rules count
    /// virt-apiserver's replicas by their scrape (`kubevirt_virt_api_up`), which a scrape of
    /// the HTTPS port, behind authentication, would not give them. Unset: none.
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// etcd endpoints, comma separated.
    #[arg(
        long,
        env = "VIRT_APISERVER_ETCD_SERVERS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_servers: Vec<String>,
    /// CA bundle that signed etcd's serving certificate (enables TLS towards etcd).
    #[arg(long, env = "VIRT_APISERVER_ETCD_CAFILE")]
    pub etcd_cafile: Option<PathBuf>,
    /// Client certificate towards etcd (PEM).
    #[arg(long, env = "VIRT_APISERVER_ETCD_CERTFILE", requires = "etcd_cafile")]
    pub etcd_certfile: Option<PathBuf>,
    /// Key of --etcd-certfile (PEM).
    #[arg(long, env = "VIRT_APISERVER_ETCD_KEYFILE", requires = "etcd_certfile")]
    pub etcd_keyfile: Option<PathBuf>,
    /// Key prefix in etcd.
    #[arg(long, env = "VIRT_APISERVER_ETCD_PREFIX", default_value = "/registry")]
    pub etcd_prefix: String,
    /// Serving certificate (PEM).
    #[arg(long, env = "VIRT_APISERVER_TLS_CERT_FILE")]
    pub tls_cert_file: PathBuf,
    /// Serving key (PEM).
    #[arg(long, env = "VIRT_APISERVER_TLS_PRIVATE_KEY_FILE")]
    pub tls_private_key_file: PathBuf,
    /// CA bundle for x509 client-certificate users.
    #[arg(long, env = "VIRT_APISERVER_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// CA bundle of the front proxy (kube-apiserver's aggregator).
    #[arg(long, env = "VIRT_APISERVER_REQUESTHEADER_CLIENT_CA_FILE")]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Allowed CNs of the front-proxy certificate (empty = any signed by its CA).
    #[arg(
        long,
        env = "VIRT_APISERVER_REQUESTHEADER_ALLOWED_NAMES",
        value_delimiter = ',',
        default_value = "front-proxy-client"
    )]
    pub requestheader_allowed_names: Vec<String>,
    /// Username headers.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    pub requestheader_username_headers: Vec<String>,
    /// Group headers.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    pub requestheader_group_headers: Vec<String>,
    /// Extra header prefixes.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// Kubeconfig for kube-apiserver (TokenReview, SubjectAccessReview). In a pod the
    /// in-cluster configuration is used when this is not given.
    #[arg(long, env = "VIRT_APISERVER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Do not talk to kube-apiserver at all (local development without a cluster).
    #[arg(long, env = "VIRT_APISERVER_STANDALONE")]
    pub standalone: bool,
    /// Grant full access to users authenticated by --client-ca-file (development only).
    #[arg(long, env = "VIRT_APISERVER_ALLOW_CLIENT_CA_USERS")]
    pub allow_client_ca_users: bool,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 3 * 1024 * 1024)]
    pub max_request_body_bytes: usize,
    /// Read-only requests handled at once (watches and streams not counted); beyond it 429.
    /// 0: no limit. kube-apiserver's flag and default.
    #[arg(long, default_value_t = crate::inflight::DEFAULT_READ_ONLY)]
    pub max_requests_inflight: usize,
    /// Mutating requests handled at once; beyond it 429. 0: no limit.
    #[arg(long, default_value_t = crate::inflight::DEFAULT_MUTATING)]
    pub max_mutating_requests_inflight: usize,
    /// Watches one user may have open at once; beyond it 429. 0: no limit.
    #[arg(long, default_value_t = crate::inflight::DEFAULT_WATCHES_PER_USER)]
    pub max_watches_per_user: usize,
    /// Console, VNC and port-forward streams one user may have open at once; beyond it 429.
    /// 0: no limit.
    #[arg(long, default_value_t = crate::inflight::DEFAULT_STREAMS_PER_USER)]
    pub max_streams_per_user: usize,
    /// Open client connections at most (at the limit, the connection idle the longest is
    /// closed to make room; when none is idle, accepting waits).
    #[arg(long, default_value_t = 8192)]
    pub max_connections: usize,
    /// Seconds an HTTP/1 client has to send a request's headers, counted from when the
    /// connection waits for one (so idle keep-alive connections end too).
    #[arg(long, default_value_t = 30)]
    pub header_read_timeout_seconds: u64,
    /// Seconds between reads of the client CAs (the files given, or kube-apiserver's
    /// published authentication ConfigMap): a rotated CA is in use by the next read.
    #[arg(long, default_value_t = 30)]
    pub ca_reload_seconds: u64,
    /// Seconds a connection that has served requests may stay with none in flight before it
    /// is closed (kube-apiserver's is 90).
    #[arg(long, default_value_t = 90)]
    pub idle_timeout_seconds: u64,
    /// Seconds after which a connection takes no new requests (HTTP/2 GOAWAY: the client
    /// opens another) and closes once those in flight end.
    #[arg(long, default_value_t = 1800)]
    pub max_connection_age_seconds: u64,
    /// Events the watch cache keeps per resource for watchers resuming from an earlier
    /// resourceVersion (older ones are served by etcd); 0 turns the cache off, so every
    /// watch and LIST goes to etcd.
    #[arg(long, default_value_t = crate::cache::DEFAULT_HISTORY)]
    pub watch_cache_history: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 60)]
    pub bookmark_interval_seconds: u64,
    /// Seconds /readyz fails before the listener closes on SIGTERM.
    #[arg(long, default_value_t = 0)]
    pub shutdown_delay_seconds: u64,
    /// CA bundle that signed virt-handler's serving certificate (verified as DNS name
    /// `virt-handler` whatever address is dialled).
    #[arg(long, env = "VIRT_APISERVER_HANDLER_CA")]
    pub handler_ca: Option<PathBuf>,
    /// Client certificate presented to virt-handler (PEM).
    #[arg(long, env = "VIRT_APISERVER_HANDLER_CLIENT_CERT")]
    pub handler_client_cert: Option<PathBuf>,
    /// Key of --handler-client-cert (PEM).
    #[arg(long, env = "VIRT_APISERVER_HANDLER_CLIENT_KEY")]
    pub handler_client_key: Option<PathBuf>,
    /// Fixed virt-handler address of a node, NODE=HOST:PORT (repeatable); overrides the
    /// lookup of the handler pod.
    #[arg(long = "handler-address")]
    pub handler_address: Vec<String>,
    /// Namespace of the virt-handler pods (the apiserver's own namespace in a cluster).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kubevirt")]
    pub handler_namespace: String,
    /// virt-handler's port on its pod IP.
    #[arg(long, default_value_t = virt_handler_port())]
    pub handler_port: u16,
    /// KubeVirt feature gates in force, comma separated (virt-operator passes the
    /// KubeVirt resource's `spec.configuration.developerConfiguration.featureGates`).
    /// Only `HostDisk` (without it hostDisk volumes are refused) and `HotplugVolumes` /
    /// `DeclarativeHotplugVolumes` (the addvolume/removevolume subresources) change anything
    /// here.
    #[arg(long, env = "VIRT_APISERVER_FEATURE_GATES", value_delimiter = ',')]
    pub feature_gates: Vec<String>,
    /// evictionStrategy of VMIs that set none (virt-operator passes the KubeVirt resource's
    /// `spec.configuration.evictionStrategy`): None, LiveMigrate, LiveMigrateIfPossible,
    /// External.
    #[arg(long, default_value = "None", value_parser = parse_eviction_strategy)]
    pub eviction_strategy: kubevirt_api::eviction::EvictionStrategy,
    /// Where CDI's upload proxy listens (TLS with the serving certificate; Service
    /// `cdi-uploadproxy`). Without it no proxy is served.
    #[arg(long, env = "VIRT_APISERVER_UPLOAD_PROXY_BIND")]
    pub upload_proxy_bind: Option<std::net::SocketAddr>,
    /// File holding the key UploadTokenRequests' tokens are signed with (virt-operator's
    /// Secret, the same in every replica so any one verifies another's token). Without it
    /// a random key: fine for one replica, which then alone can verify its tokens.
    #[arg(long, env = "VIRT_APISERVER_UPLOAD_TOKEN_KEY_FILE")]
    pub upload_token_key_file: Option<PathBuf>,
    /// Log format: text or json.
    #[arg(long, env = "VIRT_APISERVER_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
}

fn parse_eviction_strategy(s: &str) -> Result<kubevirt_api::eviction::EvictionStrategy, String> {
    kubevirt_api::eviction::EvictionStrategy::parse(s)
        .ok_or_else(|| "expected None, LiveMigrate, LiveMigrateIfPossible or External".to_string())
}

const fn virt_handler_port() -> u16 {
    kubevirt_api::handler_protocol::HANDLER_PORT
}

impl Args {
    /// The connection limits the flags give.
    pub fn connection_limits(&self) -> crate::server::ConnectionLimits {
        crate::server::ConnectionLimits {
            max_connections: self.max_connections,
            header_read_timeout: Duration::from_secs(self.header_read_timeout_seconds.max(1)),
            idle_timeout: Duration::from_secs(self.idle_timeout_seconds.max(1)),
            max_age: Duration::from_secs(self.max_connection_age_seconds.max(1)),
            ..Default::default()
        }
    }

    /// Interval between bookmarks.
    pub fn bookmark_interval(&self) -> Duration {
        Duration::from_secs(self.bookmark_interval_seconds.max(1))
    }
}
