//! kube-runtime watchers that never stay blind.
//!
//! `kube::runtime::watcher` re-lists after a 410 that arrives as an ERROR event on an
//! open stream, but any other failure — an HTTP 410 when a watch starts, a 500 on every
//! attempt, a stream that keeps ending with errors — is retried at the same
//! resourceVersion forever: the watcher then sees nothing new until the process is
//! restarted (a virt-handler that misses its node's VMIs and incoming migrations).
//! [`watch`] wraps it: errors still reach the caller (for its logs), with a bounded
//! back-off between attempts, and after a 410 of any form or [`MAX_FAILURES`] failures
//! in a row it starts over with a fresh list, saying so in a log line and a metric.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::Api;
use kube::runtime::watcher::{self, Event};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;

/// Failures in a row after which the watcher starts over with a fresh list.
pub const MAX_FAILURES: u32 = 5;
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Short on purpose: a watch asks again at least this often while the API is down, so it
/// resumes within about this long of the API answering again (issue 51: blind for minutes).
const MAX_BACKOFF: Duration = Duration::from_secs(4);

/// Labels of the watch metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    /// Which watch of the process (e.g. `vmis`, `incoming-migrations`).
    pub watch: String,
    /// Why it started over: `expired` (410) or `failures`; empty for errors.
    pub reason: String,
}

/// Counters of watch failures and fresh lists, and which watches are blind right now.
/// Cheap to clone (shared state).
#[derive(Clone, Debug, Default)]
pub struct WatchMetrics {
    /// Errors returned by the watcher.
    pub errors: Family<WatchLabels, Counter>,
    /// Fresh lists forced after a 410 or repeated failures.
    pub relists: Family<WatchLabels, Counter>,
    blind: Arc<Mutex<Blind>>,
}

/// The watches whose last attempt failed, by watch id: a process that cannot see its
/// objects says so on its readiness endpoint (issue 51: a controller stayed blind for
/// minutes after an outage and nothing showed it).
#[derive(Debug, Default)]
struct Blind {
    next_id: u64,
    since: BTreeMap<u64, (&'static str, Instant)>,
}

impl WatchMetrics {
    fn new_watch(&self) -> u64 {
        let mut b = lock(&self.blind);
        b.next_id += 1;
        b.next_id
    }

    fn set_blind(&self, id: u64, name: &'static str, blind: bool) {
        let mut b = lock(&self.blind);
        if blind {
            b.since.entry(id).or_insert((name, Instant::now()));
        } else {
            b.since.remove(&id);
        }
    }

    /// The watches whose last attempt failed and for how long, longest first.
    pub fn blind(&self) -> Vec<(&'static str, Duration)> {
        let b = lock(&self.blind);
        let mut v: Vec<_> = b.since.values().map(|(n, t)| (*n, t.elapsed())).collect();
        v.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
        v
    }

    /// A readiness answer: `Ok` when every watch sees its objects, else the blind ones.
    pub fn readiness(&self) -> Result<&'static str, String> {
        let blind = self.blind();
        if blind.is_empty() {
            return Ok("ok");
        }
        let list: Vec<String> = blind
            .iter()
            .map(|(n, d)| format!("{n} (failing for {:.0} s)", d.as_secs_f64()))
            .collect();
        Err(format!("blind watches: {}", list.join(", ")))
    }
}

/// `GET /readyz` of a process's metrics port: 200 `ok`, or 503 naming the blind watches.
pub fn readyz(watches: &WatchMetrics) -> (http::StatusCode, String) {
    match watches.readiness() {
        Ok(ok) => (http::StatusCode::OK, ok.to_string()),
        Err(blind) => (http::StatusCode::SERVICE_UNAVAILABLE, blind),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl WatchMetrics {
    /// Registers the counters as `<prefix>_watch_errors_total` and
    /// `<prefix>_watch_relists_total`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "watch_errors",
            "Errors returned by API watches",
            self.errors.clone(),
        );
        registry.register(
            "watch_relists",
            "API watches started over with a fresh list (after 410 Gone or repeated failures)",
            self.relists.clone(),
        );
        registry.register(
            "watches_blind",
            "API watches whose last attempt failed (the process does not see those objects)",
            BlindGauge(self.blind.clone()),
        );
    }
}

/// What to do after a watcher error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Keep the watcher (it resumes where it was), after a back-off.
    Retry,
    /// Drop the watcher and list again: the resourceVersion is gone.
    RelistExpired,
    /// Drop the watcher and list again: too many failures in a row.
    RelistFailures,
}

/// True when the error says the resourceVersion is no longer available, whether the
/// server said it on an open stream or as the HTTP status of the request.
pub fn is_gone(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e)
        | watcher::Error::InitialListFailed(e) => {
            matches!(e, kube::Error::Api(status) if status.code == 410)
        }
        watcher::Error::NoResourceVersion => false,
    }
}

/// Decides the recovery after the `failures`-th error in a row (counting this one).
pub fn recovery(err: &watcher::Error, failures: u32) -> Recovery {
    if is_gone(err) {
        Recovery::RelistExpired
    } else if failures >= MAX_FAILURES {
        Recovery::RelistFailures
    } else {
        Recovery::Retry
    }
}

/// The back-off before the next attempt after `failures` errors in a row.
pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    FIRST_BACKOFF.saturating_mul(1 << exp).min(MAX_BACKOFF)
}

/// True when the event carries the server's answer. kube's watcher emits `Init` before
/// it sends the list request, so an `Init` between two failed lists proves nothing: taken
/// as a success it reset the back-off, and a server failing every list (an aggregated API
/// not yet available answers 404) was asked again every 200 ms for as long as it failed.
pub fn answered<K>(ev: &Event<K>) -> bool {
    !matches!(ev, Event::Init)
}

/// The number of blind watches, read at scrape time.
#[derive(Debug)]
struct BlindGauge(Arc<Mutex<Blind>>);

impl prometheus_client::encoding::EncodeMetric for BlindGauge {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&(lock(&self.0).since.len() as i64))
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Gauge
    }
}

impl prometheus_client::metrics::TypedMetric for BlindGauge {
    const TYPE: prometheus_client::metrics::MetricType =
        prometheus_client::metrics::MetricType::Gauge;
}

struct State<K: Clone + DeserializeOwned + Debug + Send + 'static> {
    api: Api<K>,
    config: watcher::Config,
    name: &'static str,
    metrics: WatchMetrics,
    inner: futures::stream::BoxStream<'static, watcher::Result<Event<K>>>,
    failures: u32,
    pause: Option<Duration>,
    id: u64,
}

impl<K: Clone + DeserializeOwned + Debug + Send + 'static> Drop for State<K> {
    fn drop(&mut self) {
        // A watch given up (a controller that lost its lease) is not blind, just gone.
        self.metrics.set_blind(self.id, self.name, false);
    }
}

/// Watches `api` like `kube::runtime::watcher(api, config)`, recovering on its own (see
/// the crate docs). `name` labels the log lines and metrics.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    name: &'static str,
    metrics: WatchMetrics,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let inner = watcher::watcher(api.clone(), config.clone()).boxed();
    let id = metrics.new_watch();
    let state = State {
        id,
        api,
        config,
        name,
        metrics,
        inner,
        failures: 0,
        pause: None,
    };
    futures::stream::unfold(state, |mut st| async move {
        if let Some(pause) = st.pause.take() {
            tokio::time::sleep(pause).await;
        }
        let item = st.inner.next().await?;
        match &item {
            Ok(ev) => {
                if answered(ev) {
                    st.failures = 0;
                    st.metrics.set_blind(st.id, st.name, false);
                }
            }
            Err(err) => {
                st.failures += 1;
                st.metrics.set_blind(st.id, st.name, true);
                let labels = |reason: &str| WatchLabels {
                    watch: st.name.to_string(),
                    reason: reason.to_string(),
                };
                st.metrics.errors.get_or_create(&labels("")).inc();
                let recovery = recovery(err, st.failures);
                // Every failure starts over with a fresh list: a watch resumed from its last
                // resourceVersion proves nothing until an object changes, and a quiet one
                // (migrations to this node: none for hours) stayed blind, its process unready,
                // for good after one blip of the API (the e2e found virt-handler unready
                // 7 minutes after an etcd move). The list's answer ends the blindness.
                let reason = match recovery {
                    Recovery::Retry => "error",
                    Recovery::RelistExpired => "expired",
                    Recovery::RelistFailures => "failures",
                };
                tracing::warn!(
                    watch = st.name,
                    reason,
                    failures = st.failures,
                    error = %err,
                    "watch starts over with a fresh list"
                );
                st.metrics.relists.get_or_create(&labels(reason)).inc();
                st.inner = watcher::watcher(st.api.clone(), st.config.clone()).boxed();
                // Even an expired watch waits a little: a server answering 410 to every
                // list would otherwise be hammered.
                st.pause = Some(backoff(st.failures));
                if recovery != Recovery::Retry {
                    st.failures = st.failures.min(MAX_FAILURES - 1);
                }
            }
        }
        Some((item, st))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn status(code: u16) -> Box<Status> {
        Box::new(Status::failure("x", "y").with_code(code))
    }

    #[test]
    fn gone_in_any_form_relists_at_once() {
        let in_stream = watcher::Error::WatchError(status(410));
        let at_start = watcher::Error::WatchStartFailed(kube::Error::Api(status(410)));
        assert_eq!(recovery(&in_stream, 1), Recovery::RelistExpired);
        assert_eq!(recovery(&at_start, 1), Recovery::RelistExpired);
    }

    #[test]
    fn other_errors_retry_then_relist() {
        let e = watcher::Error::WatchError(status(500));
        for n in 1..MAX_FAILURES {
            assert_eq!(recovery(&e, n), Recovery::Retry, "failure {n}");
        }
        assert_eq!(recovery(&e, MAX_FAILURES), Recovery::RelistFailures);
        let start = watcher::Error::WatchStartFailed(kube::Error::Api(status(503)));
        assert_eq!(recovery(&start, MAX_FAILURES), Recovery::RelistFailures);
    }

    #[test]
    fn only_what_the_server_sent_ends_a_run_of_failures() {
        assert!(!answered::<u8>(&Event::Init));
        for ev in [
            Event::InitApply(1),
            Event::InitDone,
            Event::Apply(1),
            Event::Delete(1),
        ] {
            assert!(answered(&ev), "{ev:?}");
        }
    }

    #[test]
    fn a_failing_watch_is_blind_until_it_answers_or_is_dropped() {
        let m = WatchMetrics::default();
        assert_eq!(m.readiness(), Ok("ok"));
        let (a, b) = (m.new_watch(), m.new_watch());
        m.set_blind(a, "vmis", true);
        m.set_blind(b, "vmis", true);
        m.set_blind(a, "vmis", true);
        assert_eq!(m.blind().len(), 2, "one entry per watch, not per name");
        let err = m.readiness().unwrap_err();
        assert!(
            err.starts_with("blind watches: vmis (failing for "),
            "{err}"
        );
        m.set_blind(a, "vmis", false);
        m.set_blind(b, "vmis", false);
        assert_eq!(m.readiness(), Ok("ok"));
        let mut text = String::new();
        let mut registry = Registry::default();
        m.set_blind(a, "vmis", true);
        m.register(&mut registry);
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("watches_blind 1"), "{text}");
    }

    #[test]
    fn backoff_grows_and_is_bounded() {
        assert_eq!(backoff(1), FIRST_BACKOFF);
        assert_eq!(backoff(2), FIRST_BACKOFF * 2);
        assert!(backoff(4) > backoff(3));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }
}
