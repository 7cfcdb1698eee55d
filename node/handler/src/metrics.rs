//! Prometheus metrics of cluster mode, served on a separate plain-HTTP port
//! (`--metrics-addr`), so scraping needs no client certificate.
//!
//! Two kinds: the handler's own (`kubevirt_handler_*`, counted as things happen) and
//! KubeVirt's per-VMI metrics (`kubevirt_vmi_*`, [`crate::domainstats`]), read at each
//! scrape from the launcher of every VMI this node runs (`getStats` on its command
//! socket), all launchers at once, each within [`STATS_TIMEOUT`]: a hung VM leaves only
//! its own series out, and the series of a VMI that left the node are gone by the next
//! scrape.
//!
//! Served as the Prometheus text format (`text/plain; version=0.0.4`), as KubeVirt's
//! virt-handler is: its counter `kubevirt_vmi_migration_data_total_bytes` has no `_total`
//! suffix, which OpenMetrics would add.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use virt_domain::protocol::{Request, Response};

use crate::client::LauncherClient;
use crate::domainstats::{Family as VmiFamily, Kind, VmiIdentity};
use crate::launcher_fs::LauncherDir;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of a status write.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `success` or `failure`.
    pub result: String,
}

/// Labels of an HTTPS request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `pause`, `unpause`, `softreboot`, `console`, `vnc`.
    pub action: String,
    /// HTTP status code of the answer (101 for an accepted websocket).
    pub code: u16,
}

/// Labels of a websocket session gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SessionLabels {
    /// `console` or `vnc`.
    pub kind: String,
}

/// How long a scrape waits for one launcher's statistics (the launcher gives up on
/// libvirt after 3 s; KubeVirt's collector waits up to 10 s for all).
pub const STATS_TIMEOUT: Duration = Duration::from_secs(4);

/// A VMI whose launcher is asked for its statistics at each scrape.
#[derive(Clone, Debug)]
pub struct VmiTarget {
    /// Who its series belong to.
    pub id: VmiIdentity,
    /// Its launcher's sockets directory.
    pub dir: LauncherDir,
}

/// The `kubevirt_vmi_*` families of the scrape under way, encoded with the rest.
#[derive(Debug, Default)]
struct VmiFamilies(Arc<Mutex<Vec<VmiFamily>>>);

/// A label value in the text format: `\`, `"` and newlines escaped (prometheus_client
/// writes label values as given, and a guest's mount points are free text: `C:\`).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Collector for VmiFamilies {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let fams = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for f in fams.iter() {
            // Each series is written as a gauge's, which keeps KubeVirt's name as it is
            // (a counter's would get `_total` appended), under the declared type: what
            // client_golang's text format writes.
            let mtype = match f.desc.kind {
                Kind::Counter => prometheus_client::metrics::MetricType::Counter,
                Kind::Gauge => prometheus_client::metrics::MetricType::Gauge,
            };
            let mut m = encoder.encode_descriptor(f.desc.name, f.desc.help, None, mtype)?;
            for s in &f.samples {
                let labels: Vec<(&str, String)> = s
                    .labels
                    .iter()
                    .map(|(k, v)| (k.as_str(), escape(v)))
                    .collect();
                ConstGauge::new(s.value).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The handler's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// The VMIs of this node, by uid.
    targets: Mutex<BTreeMap<String, VmiTarget>>,
    /// What the current scrape read; one scrape at a time.
    vmi_families: Arc<Mutex<Vec<VmiFamily>>>,
    scrape: tokio::sync::Mutex<()>,
    /// VMIs of this node being followed.
    pub vmis: Gauge,
    /// Status patches sent, by result.
    pub status_writes: Family<ResultLabels, Counter>,
    /// Launchers that went away while their VMI was not final.
    pub launchers_gone: Counter,
    /// HTTPS API requests.
    pub requests: Family<RequestLabels, Counter>,
    /// Open websocket sessions.
    pub sessions: Family<SessionLabels, Gauge>,
    /// Failures and fresh lists of the VMI watches.
    pub watches: virt_watch::WatchMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut top = Registry::default();
        let vmi_families = Arc::new(Mutex::new(Vec::new()));
        top.register_collector(Box::new(VmiFamilies(vmi_families.clone())));
        kube_client_metrics::global().register(&mut top);
        let registry = top.sub_registry_with_prefix("kubevirt_handler");
        let vmis = Gauge::default();
        registry.register("vmis", "VMIs of this node being followed", vmis.clone());
        let status_writes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "status_writes",
            "VMI status patches sent",
            status_writes.clone(),
        );
        let launchers_gone = Counter::default();
        registry.register(
            "launchers_gone",
            "Launchers that stopped answering while their VMI was not final",
            launchers_gone.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("requests", "HTTPS API requests", requests.clone());
        let sessions = Family::<SessionLabels, Gauge>::default();
        registry.register(
            "websocket_sessions",
            "Open console and VNC sessions",
            sessions.clone(),
        );
        let watches = virt_watch::WatchMetrics::default();
        watches.register(registry);
        Self {
            registry: top,
            targets: Mutex::default(),
            vmi_families,
            scrape: tokio::sync::Mutex::new(()),
            vmis,
            status_writes,
            launchers_gone,
            requests,
            sessions,
            watches,
        }
    }
}

impl Metrics {
    /// Counts a status write.
    pub fn status_write(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.status_writes
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Counts an API request.
    pub fn request(&self, action: &str, code: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                action: action.into(),
                code,
            })
            .inc();
    }

    /// The open-sessions gauge of `kind`.
    pub fn sessions(&self, kind: &str) -> Gauge {
        self.sessions
            .get_or_create(&SessionLabels { kind: kind.into() })
            .clone()
    }

    /// Follows the VMI `uid` (its identity and launcher may change: set each time).
    pub fn set_target(&self, uid: &str, target: VmiTarget) {
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.to_string(), target);
    }

    /// The VMI `uid` left this node: no more series of it.
    pub fn remove_target(&self, uid: &str) {
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// Reads every followed VMI's statistics from its launcher (all at once, each within
    /// [`STATS_TIMEOUT`]), then encodes everything. A launcher that fails or is late
    /// leaves its VMI out of this scrape, with a debug line.
    pub async fn scrape(&self) -> String {
        let _one = self.scrape.lock().await;
        let targets: Vec<VmiTarget> = self
            .targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let reads = targets.into_iter().map(|t| async move {
            let c = LauncherClient::new(t.dir.clone()).with_timeout(STATS_TIMEOUT);
            match c.call(&Request::GetStats).await {
                Ok(Response::Stats { stats }) => Some((t.id, *stats)),
                Ok(other) => {
                    tracing::debug!(ns = %t.id.namespace, name = %t.id.name, reply = ?other, "no domain statistics");
                    None
                }
                Err(e) => {
                    tracing::debug!(ns = %t.id.namespace, name = %t.id.name, error = %e, "no domain statistics");
                    None
                }
            }
        });
        let read: Vec<_> = futures::future::join_all(reads)
            .await
            .into_iter()
            .flatten()
            .collect();
        *self.vmi_families.lock().unwrap_or_else(|p| p.into_inner()) =
            crate::domainstats::families(&read);
        let text = self.encode();
        self.vmi_families
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        text
    }

    /// Text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serves `/metrics`, `/readyz` (no blind watch) and `/healthz` on `listener` until
/// `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: std::sync::Arc<Metrics>,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let watches = metrics.watches.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let m = metrics.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        m.scrape().await,
                    )
                }
            }),
        )
        .route(
            "/readyz",
            axum::routing::get(move || {
                let w = watches.clone();
                async move { virt_watch::readyz(&w) }
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exposed_with_the_prefix() {
        let m = Metrics::default();
        m.status_write(true);
        m.request("pause", 200);
        m.sessions("console").inc();
        m.vmis.set(2);
        let text = m.encode();
        for needle in [
            "kubevirt_handler_status_writes_total{result=\"success\"} 1",
            "kubevirt_handler_requests_total{action=\"pause\",code=\"200\"} 1",
            "kubevirt_handler_websocket_sessions{kind=\"console\"} 1",
            "kubevirt_handler_vmis 2",
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
    }

    /// A fake launcher that answers `getStats` with `stats`, or never answers.
    fn launcher(dir: &std::path::Path, stats: Option<virt_domain::stats::DomainStats>) {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let l = tokio::net::UnixListener::bind(dir.join(crate::client::CMD_SOCKET))
            .unwrap_or_else(|e| panic!("bind: {e}"));
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let stats = stats.clone();
                tokio::spawn(async move {
                    let (r, mut w) = s.into_split();
                    let mut lines = BufReader::new(r).lines();
                    let _ = lines.next_line().await;
                    let Some(stats) = stats else {
                        // Hung: holds the connection, says nothing.
                        std::future::pending::<()>().await;
                        return;
                    };
                    let mut line = serde_json::to_vec(&Response::Stats {
                        stats: Box::new(stats),
                    })
                    .unwrap_or_default();
                    line.push(b'\n');
                    let _ = w.write_all(&line).await;
                });
            }
        });
    }

    fn target(dir: &std::path::Path, name: &str) -> VmiTarget {
        VmiTarget {
            id: VmiIdentity {
                node: "vm".into(),
                namespace: "default".into(),
                name: name.into(),
                labels: BTreeMap::new(),
            },
            dir: LauncherDir::new(crate::launcher_fs::Location::Host(dir.to_path_buf())),
        }
    }

    /// A scrape asks every VMI's launcher; a hung one leaves only its own series out
    /// (within [`STATS_TIMEOUT`]), and a VMI that left has no series at the next scrape.
    #[tokio::test]
    async fn a_scrape_reads_every_launcher_and_a_hung_one_is_left_out() {
        let (a, b) = (
            tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
            tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
        );
        let mut stats = virt_domain::stats::DomainStats::default();
        stats.cpu.time_ns = Some(3_000_000_000);
        stats.memory.current_kib = Some(1024);
        stats.filesystems = vec![virt_domain::stats::FileSystemStats {
            disk_name: "Volume{1}".into(),
            mount_point: "C:\\".into(),
            file_system_type: "NTFS".into(),
            used_bytes: 10,
            total_bytes: 20,
        }];
        stats.migration = Some(virt_domain::stats::MigrationJobStats {
            data_total_bytes: Some(300),
            ..Default::default()
        });
        launcher(a.path(), Some(stats));
        launcher(b.path(), None);
        let m = Metrics::default();
        m.set_target("uid-a", target(a.path(), "a"));
        m.set_target("uid-b", target(b.path(), "b"));
        let t0 = std::time::Instant::now();
        let text = m.scrape().await;
        assert!(t0.elapsed() < STATS_TIMEOUT * 2, "{:?}", t0.elapsed());
        for needle in [
            "# TYPE kubevirt_vmi_cpu_usage_seconds_total counter",
            "kubevirt_vmi_cpu_usage_seconds_total{node=\"vm\",namespace=\"default\",name=\"a\"} 3.0",
            "# TYPE kubevirt_vmi_memory_domain_bytes gauge",
            // KubeVirt's counter without `_total` keeps its name.
            "# TYPE kubevirt_vmi_migration_data_total_bytes counter",
            "kubevirt_vmi_migration_data_total_bytes{node=\"vm\",namespace=\"default\",name=\"a\"} 300.0",
            // A guest's free text is escaped.
            "kubevirt_vmi_filesystem_used_bytes{node=\"vm\",namespace=\"default\",name=\"a\",disk_name=\"Volume{1}\",mount_point=\"C:\\\\\",file_system_type=\"NTFS\"} 10.0",
            "kubevirt_vmi_memory_domain_bytes{node=\"vm\",namespace=\"default\",name=\"a\"} 1048576.0",
            // The handler's own metrics keep their prefix.
            "kubevirt_handler_vmis 0",
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
        assert!(!text.contains("name=\"b\""), "{text}");
        assert!(!text.contains("_total_bytes_total"), "{text}");
        m.remove_target("uid-a");
        m.remove_target("uid-b");
        let text = m.scrape().await;
        assert!(!text.contains("kubevirt_vmi_"), "{text}");
    }
}
