//! Prometheus metrics of cluster mode, served on a separate plain-HTTP port
//! (`--metrics-addr`), so scraping needs no client certificate.

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

/// The handler's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
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
        let mut registry = Registry::with_prefix("kubevirt_handler");
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
        watches.register(&mut registry);
        Self {
            registry,
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

    /// Text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: std::sync::Arc<Metrics>,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let m = metrics.clone();
                async move { m.encode() }
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
}
