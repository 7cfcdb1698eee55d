//! KubeVirt's REST client metrics for kube-rs clients: every request a component makes to
//! kube-apiserver counted in `kubevirt_rest_client_requests_total` (by `code`, `method`,
//! `host`, `resource`, `verb`) and timed in `kubevirt_rest_client_request_latency_seconds`
//! (by `verb`, `url`), with KubeVirt's names, labels and buckets. KubeVirt wraps its
//! client-go transport the same way (`pkg/monitoring/metrics/common/client`), and its
//! `VirtControllerRESTErrorsHigh`, `VirtHandlerRESTErrorsHigh`, `VirtOperatorRESTErrorsHigh`
//! and `VirtApiRESTErrorsHigh` alerts read the counter.
//!
//! The families are process-wide ([`global`]), as client-go's are: every client of the
//! process counts into them, and each binary registers them once in its registry.

use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use http::{Method, Request, Response, Uri};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// KubeVirt's names and help texts (name, help, type); the counter's name is given with the
/// `_total` the registry appends.
pub const KUBEVIRT_METRICS: [(&str, &str, &str); 2] = [
    (
        "kubevirt_rest_client_requests_total",
        "Number of HTTP requests, partitioned by status code, method, and host.",
        "Counter",
    ),
    (
        "kubevirt_rest_client_request_latency_seconds",
        "Request latency in seconds. Broken down by verb and URL.",
        "Histogram",
    ),
];

/// KubeVirt's latency buckets (Kubernetes' `apiserver_request_duration_seconds`').
const LATENCY_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    code: String,
    method: String,
    host: String,
    resource: String,
    verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    verb: String,
    url: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The two families.
#[derive(Clone, Debug)]
pub struct RestClientMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
}

impl Default for RestClientMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl RestClientMetrics {
    /// Registers both families (unprefixed: KubeVirt's names) in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        // The registry ends every help text with a period and a counter's name with
        // `_total` itself.
        let [(requests, requests_help, _), (latency, latency_help, _)] = KUBEVIRT_METRICS;
        registry.register(
            requests.strip_suffix("_total").unwrap_or(requests),
            requests_help.strip_suffix('.').unwrap_or(requests_help),
            self.requests.clone(),
        );
        registry.register(
            latency,
            latency_help.strip_suffix('.').unwrap_or(latency_help),
            self.latency.clone(),
        );
    }

    fn record(&self, r: &Observed, code: &str, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                code: code.to_string(),
                method: r.method.clone(),
                host: r.host.clone(),
                resource: r.resource.clone(),
                verb: r.verb.clone(),
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                verb: r.verb.clone(),
                url: r.url.clone(),
            })
            .observe(seconds);
    }
}

/// The process' families.
pub fn global() -> &'static RestClientMetrics {
    static METRICS: OnceLock<RestClientMetrics> = OnceLock::new();
    METRICS.get_or_init(RestClientMetrics::default)
}

/// What a request is counted as.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Observed {
    method: String,
    host: String,
    resource: String,
    verb: String,
    url: String,
}

const NONE: &str = "none";

/// The resource a request path names, as KubeVirt's patterns find it: the segment after
/// `namespaces/<ns>/` in a namespaced path, else the first after the group version (and
/// after `watch/` in the old watch paths). `None` outside `/api` and `/apis`.
fn resource_of(path: &str) -> Option<(usize, bool, Vec<&str>)> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let start = match segments.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => return None,
    };
    let mut i = start;
    let watch_path = segments.get(i) == Some(&"watch");
    if watch_path {
        i += 1;
    }
    if segments.get(i) == Some(&"namespaces") && segments.len() > i + 2 {
        i += 2;
    }
    match segments.get(i) {
        Some(r) if !r.is_empty() => Some((i, watch_path, segments)),
        _ => None,
    }
}

/// KubeVirt's `resource` and `verb` labels of a request (`parseURLResourceOperation`): `GET`
/// is `WATCH` (a watch path or `watch=true`), `LIST` (the path ends at the resource) or
/// `GET`; `PUT` `UPDATE`, `PATCH` `PATCH`, `POST` `CREATE`, `DELETE` `DELETE`.
fn resource_and_verb(method: &Method, uri: &Uri) -> (String, String) {
    let Some((i, watch_path, segments)) = resource_of(uri.path()) else {
        return (NONE.into(), NONE.into());
    };
    let resource = segments[i].to_string();
    let verb = match *method {
        Method::GET => {
            let watch_query = uri
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
            if watch_path || watch_query {
                "WATCH"
            } else if i + 1 == segments.len() {
                "LIST"
            } else {
                "GET"
            }
        }
        Method::PUT => "UPDATE",
        Method::PATCH => "PATCH",
        Method::POST => "CREATE",
        Method::DELETE => "DELETE",
        ref other => return (resource, other.as_str().to_string()),
    };
    (resource, verb.to_string())
}

/// client-go's URL template of the latency label: the namespace and the object's name
/// replaced by `{namespace}` and `{name}`, no query.
fn url_template(host: &str, uri: &Uri) -> String {
    let path = uri.path();
    let templated = match resource_of(path) {
        Some((i, _, segments)) => {
            let mut out: Vec<String> = segments.iter().map(|s| s.to_string()).collect();
            if i >= 2 && segments[i - 2] == "namespaces" {
                out[i - 1] = "{namespace}".into();
            }
            if let Some(name) = out.get_mut(i + 1) {
                *name = "{name}".into();
            }
            format!("/{}", out.join("/"))
        }
        None => path.to_string(),
    };
    format!("https://{host}{templated}")
}

/// The tower layer counting a client's requests into [`global`] (or other families).
#[derive(Clone, Debug)]
pub struct MetricsLayer {
    metrics: RestClientMetrics,
    host: String,
}

impl MetricsLayer {
    /// Counts into `metrics`; `host` is the API server's `host:port` (a kube client's
    /// requests carry only the path where this layer sits).
    pub fn new(metrics: RestClientMetrics, host: impl Into<String>) -> Self {
        Self {
            metrics,
            host: host.into(),
        }
    }
}

impl<S> tower::Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MetricsService {
            inner,
            metrics: self.metrics.clone(),
            host: self.host.clone(),
        }
    }
}

/// [`MetricsLayer`]'s service.
#[derive(Clone, Debug)]
pub struct MetricsService<S> {
    inner: S,
    metrics: RestClientMetrics,
    host: String,
}

impl<S, B, RB> tower::Service<Request<B>> for MetricsService<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (resource, verb) = resource_and_verb(req.method(), req.uri());
        let observed = Observed {
            method: req.method().as_str().to_string(),
            host: self.host.clone(),
            url: url_template(&self.host, req.uri()),
            resource,
            verb,
        };
        let metrics = self.metrics.clone();
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            let code = match &result {
                Ok(resp) => resp.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            metrics.record(&observed, &code, start.elapsed().as_secs_f64());
            result
        })
    }
}

/// A client for `config` whose requests count into [`global`].
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.as_str().to_string())
        .unwrap_or_else(|| NONE.to_string());
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&MetricsLayer::new(global().clone(), host))
        .build())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn rv(method: Method, uri: &str) -> (String, String) {
        resource_and_verb(&method, &uri.parse().unwrap())
    }

    #[test]
    fn resources_and_verbs_are_kubevirts() {
        let cases = [
            (Method::GET, "/api/v1/namespaces/ns/pods", ("pods", "LIST")),
            (
                Method::GET,
                "/api/v1/namespaces/ns/pods/p1",
                ("pods", "GET"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=5",
                ("pods", "WATCH"),
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/ns/pods",
                ("pods", "WATCH"),
            ),
            (
                Method::GET,
                "/apis/kubevirt.io/v1/virtualmachineinstances",
                ("virtualmachineinstances", "LIST"),
            ),
            (
                Method::PUT,
                "/apis/kubevirt.io/v1/namespaces/ns/virtualmachines/vm/status",
                ("virtualmachines", "UPDATE"),
            ),
            (
                Method::PATCH,
                "/apis/apps/v1/namespaces/kubevirt/daemonsets/virt-handler",
                ("daemonsets", "PATCH"),
            ),
            (
                Method::POST,
                "/api/v1/namespaces/ns/pods",
                ("pods", "CREATE"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/ns/pods/p1",
                ("pods", "DELETE"),
            ),
            (Method::GET, "/api/v1/nodes/n1", ("nodes", "GET")),
            (
                Method::GET,
                "/api/v1/namespaces/kubevirt",
                ("namespaces", "GET"),
            ),
            (
                Method::POST,
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                ("subjectaccessreviews", "CREATE"),
            ),
            (Method::GET, "/version", ("none", "none")),
            (Method::GET, "/apis", ("none", "none")),
        ];
        for (method, uri, (resource, verb)) in cases {
            assert_eq!(
                rv(method.clone(), uri),
                (resource.to_string(), verb.to_string()),
                "{method} {uri}"
            );
        }
    }

    #[test]
    fn latency_urls_are_templates_without_names() {
        let t = |u: &str| url_template("10.0.0.1:6443", &u.parse().unwrap());
        assert_eq!(
            t("/api/v1/namespaces/ns/pods/p1?timeout=5s"),
            "https://10.0.0.1:6443/api/v1/namespaces/{namespace}/pods/{name}"
        );
        assert_eq!(
            t("/apis/kubevirt.io/v1/namespaces/ns/virtualmachines"),
            "https://10.0.0.1:6443/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines"
        );
        assert_eq!(
            t("/api/v1/nodes/n1"),
            "https://10.0.0.1:6443/api/v1/nodes/{name}"
        );
        assert_eq!(t("/version"), "https://10.0.0.1:6443/version");
    }

    #[tokio::test]
    async fn the_layer_counts_by_code() {
        use tower::{Layer, ServiceExt};
        let metrics = RestClientMetrics::default();
        let svc = MetricsLayer::new(metrics.clone(), "h:6443").layer(tower::service_fn(
            |req: Request<()>| async move {
                let status = if req.uri().path().ends_with("missing") {
                    404
                } else {
                    200
                };
                Ok::<_, std::convert::Infallible>(
                    Response::builder().status(status).body(()).unwrap(),
                )
            },
        ));
        let get = |p: &str| Request::get(p).body(()).unwrap();
        svc.clone()
            .oneshot(get("/api/v1/namespaces/ns/pods/p"))
            .await
            .unwrap();
        svc.clone()
            .oneshot(get("/api/v1/namespaces/ns/pods/missing"))
            .await
            .unwrap();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for code in ["200", "404"] {
            assert!(
                text.contains(&format!(
                    "kubevirt_rest_client_requests_total{{code=\"{code}\",method=\"GET\",host=\"h:6443\",resource=\"pods\",verb=\"GET\"}} 1"
                )),
                "{text}"
            );
        }
        assert!(text.contains("# HELP kubevirt_rest_client_request_latency_seconds Request latency in seconds. Broken down by verb and URL.\n"));
        assert!(
            text.contains("url=\"https://h:6443/api/v1/namespaces/{namespace}/pods/{name}\""),
            "{text}"
        );
    }
}
