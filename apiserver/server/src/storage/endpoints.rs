//! Which etcd members virt-apiserver sends its requests to, and which failed requests it sends
//! again.
//!
//! etcd-client balances over every endpoint it holds, and tonic's balancer keeps a member that
//! stopped answering in rotation: its reconnect reports the endpoint ready and each request
//! picked for it fails at once. With one member of three down, about a third of all requests
//! would fail. So a task asks every member for its status and keeps in the client only those
//! that answer with a leader and are not learners (which refuse most requests), as etcd's Go
//! client does with gRPC health checks. Between a member's failure and the next probe, and
//! while etcd elects a new leader, failed requests are sent again ([`transient`]); the
//! storage's writes are compare-and-swaps, which apply at most once however often they are
//! sent ([`not_applied`] tells whether an attempt may have been applied).

use std::collections::BTreeSet;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::EtcdTls;

/// How long one probe may take: a member slower than this is as good as down for serving.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Options of a client of one member, for a probe.
fn probe_options(tls: Option<&EtcdTls>) -> ConnectOptions {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(PROBE_TIMEOUT)
        .with_timeout(PROBE_TIMEOUT);
    if let Some(t) = tls {
        opts = opts.with_tls(super::tls_options(t));
    }
    opts
}

/// Whether the member at `url` can serve: it answers, knows a leader and is no learner.
pub(crate) async fn probe(url: &str, tls: Option<&EtcdTls>) -> Result<(), String> {
    let work = async {
        let mut c = Client::connect([url], Some(probe_options(tls)))
            .await
            .map_err(|e| e.to_string())?;
        let st = c.status().await.map_err(|e| e.to_string())?;
        if st.leader() == 0 {
            return Err("no leader".to_string());
        }
        if st.is_learner() {
            return Err("a learner (not yet a voting member)".to_string());
        }
        Ok(())
    };
    match tokio::time::timeout(PROBE_TIMEOUT * 2, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {:?}", PROBE_TIMEOUT * 2)),
    }
}

/// [`probe`]s every endpoint at once: the healthy ones, and why each other one is not.
pub(crate) async fn probe_all(
    endpoints: &[String],
    tls: Option<&EtcdTls>,
) -> (BTreeSet<String>, Vec<(String, String)>) {
    let results = futures::future::join_all(
        endpoints
            .iter()
            .map(|e| async move { (e, probe(e, tls).await) }),
    )
    .await;
    let mut healthy = BTreeSet::new();
    let mut down = Vec::new();
    for (e, r) in results {
        match r {
            Ok(()) => {
                healthy.insert(e.clone());
            }
            Err(why) => down.push((e.clone(), why)),
        }
    }
    (healthy, down)
}

/// The endpoints the client should hold: those that can serve or, when none can, all of them
/// (a request may still find one that recovered; with none held it would have nowhere to go).
pub(crate) fn wanted(all: &[String], healthy: &BTreeSet<String>) -> BTreeSet<String> {
    if healthy.is_empty() {
        all.iter().cloned().collect()
    } else {
        healthy.clone()
    }
}

/// What to add to and remove from the client's endpoints to hold `wanted`.
pub(crate) fn changes(
    in_use: &BTreeSet<String>,
    wanted: &BTreeSet<String>,
) -> (Vec<String>, Vec<String>) {
    (
        wanted.difference(in_use).cloned().collect(),
        in_use.difference(wanted).cloned().collect(),
    )
}

/// Whether `e` or anything it was caused by is a refused connection.
fn refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Whether a failed request certainly changed nothing in etcd: no connection could be made
/// (the member is down), or etcd refused it before proposing it (no leader, during an
/// election). Not a broken connection or a timeout: a write may have been applied then.
pub(crate) fn not_applied(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            (s.code() == tonic::Code::Unavailable && s.message().contains("no leader"))
                || refused(s)
        }
        etcd_client::Error::TransportError(t) => refused(t),
        etcd_client::Error::IoError(io) => io.kind() == std::io::ErrorKind::ConnectionRefused,
        _ => false,
    }
}

/// Whether another attempt of a failed request may succeed: the member went down or lost
/// its leader, the connection broke, etcd timed out waiting for a leader (during an election).
/// Not an error etcd answered on purpose (compacted, future revision, a bad request).
pub(crate) fn transient(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::DeadlineExceeded
            ) && !s.message().contains("compacted")
                && !s.message().contains("future revision")
        }
        _ => false,
    }
}

/// How long one attempt of a request may take before it is given up and sent again. etcd
/// itself answers a proposal lost with a failed leader only after 7 s (5 s + two election
/// timeouts); by 3 s a new leader has long been elected.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);

/// Pauses between attempts of one request: about 3 s in all, enough for etcd to elect a new
/// leader (1 s election timeout) and for the probe to take a dead member out of rotation.
pub(crate) const RETRY_DELAYS: [Duration; 6] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
    Duration::from_millis(1500),
];

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_member_that_stops_answering_leaves_rotation_and_comes_back() {
        let all: Vec<String> = ["a", "b", "c"].map(String::from).into();
        let in_use = set(&["a", "b", "c"]);
        let w = wanted(&all, &set(&["a", "c"]));
        assert_eq!(changes(&in_use, &w), (vec![], vec!["b".to_string()]));
        let w2 = wanted(&all, &set(&["a", "b", "c"]));
        assert_eq!(changes(&w, &w2), (vec!["b".to_string()], vec![]));
        // None answers: keep (or put back) every endpoint rather than none.
        assert_eq!(wanted(&all, &BTreeSet::new()), in_use);
    }

    #[test]
    fn only_requests_that_cannot_have_been_applied_are_sent_again() {
        let no_leader =
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("etcdserver: no leader"));
        assert!(not_applied(&no_leader) && transient(&no_leader));
        let refused = etcd_client::Error::IoError(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        ));
        assert!(not_applied(&refused));
        // A connection that broke mid-request: a write may have been applied.
        let reset = etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
            "error reading a body from connection",
        ));
        assert!(!not_applied(&reset) && transient(&reset));
        let timeout = etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
            "etcdserver: request timed out, possibly due to previous leader failure",
        ));
        assert!(!not_applied(&timeout) && transient(&timeout));
        let compacted = etcd_client::Error::GRpcStatus(tonic::Status::out_of_range(
            "etcdserver: mvcc: required revision has been compacted",
        ));
        assert!(!not_applied(&compacted) && !transient(&compacted));
        let bad = etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument(
            "etcdserver: key is not provided",
        ));
        assert!(!transient(&bad));
    }
}
