//! virt-operator's etcd membership changes (`etcd_members`) against real etcd processes on
//! loopback, this test playing kubelet and the StatefulSet controller: the single member from
//! before clusters (loopback peer URL, plain HTTP) grows to three — restarted with peer TLS as
//! the cluster's pod template does, its peer URL advertised, learners added, started and
//! promoted one at a time — and shrinks back to one, every key kept throughout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions};
use virt_operator::etcd_members::{self, Addresses, ClientTls};
use virt_operator::render::etcd::{PEER_COMMON_NAME, initial_cluster_of, member_name};

/// Ports of one ordinal: client, peer, metrics.
type Ports = (u16, u16, u16);

struct Etcd {
    dir: tempfile::TempDir,
    ports: Vec<Ports>,
    running: BTreeMap<usize, Child>,
    addresses: Addresses,
    tls: ClientTls,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for (_, mut c) in std::mem::take(&mut self.running) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, pem).unwrap();
    p
}

impl Etcd {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let validity = time::Duration::days(1);
        let ca = virt_certs::Ca::generate("etcd-members-test-ca", validity).unwrap();
        write(d, "ca.crt", ca.cert_pem());
        let server = ca
            .issue_server("kubevirt-etcd", &["127.0.0.1"], validity)
            .unwrap();
        write(d, "server.crt", &server.cert_pem);
        write(d, "server.key", &server.key_pem);
        let peer = ca
            .issue_peer(PEER_COMMON_NAME, &["127.0.0.1"], validity)
            .unwrap();
        write(d, "peer.crt", &peer.cert_pem);
        write(d, "peer.key", &peer.key_pem);
        let client = ca
            .issue_client("virt-operator", &[] as &[&str], validity)
            .unwrap();
        let port = || virt_devenv::free_port().unwrap();
        let ports: Vec<Ports> = (0..3).map(|_| (port(), port(), port())).collect();
        let addresses = Addresses {
            peer_urls: ports
                .iter()
                .map(|(_, p, _)| format!("https://127.0.0.1:{p}"))
                .collect(),
            client_urls: ports
                .iter()
                .map(|(c, _, _)| format!("https://127.0.0.1:{c}"))
                .collect(),
            legacy_peer_url: String::new(),
        };
        let legacy_peer = port();
        let mut e = Self {
            dir,
            ports,

            running: BTreeMap::new(),
            addresses,
            tls: ClientTls {
                ca: ca.cert_pem().to_string(),
                cert: client.cert_pem,
                key: client.key_pem,
            },
        };
        e.addresses.legacy_peer_url = format!("http://127.0.0.1:{legacy_peer}");
        e
    }

    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Flags both kinds of member share: data, client TLS, metrics.
    fn command(&self, i: usize) -> Command {
        let (client, _, metrics) = self.ports[i];
        let mut c = Command::new("/usr/bin/etcd");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("etcd-{i}.log")))
            .unwrap();
        c.arg(format!(
            "--data-dir={}",
            self.dir.path().join(format!("data-{i}")).display()
        ))
        .arg(format!("--listen-client-urls=https://127.0.0.1:{client}"))
        .arg(format!("--cert-file={}", self.file("server.crt")))
        .arg(format!("--key-file={}", self.file("server.key")))
        .arg(format!("--trusted-ca-file={}", self.file("ca.crt")))
        .arg("--client-cert-auth=true")
        .arg(format!("--listen-metrics-urls=http://127.0.0.1:{metrics}"))
        .stdout(Stdio::null())
        .stderr(log);
        c
    }

    /// The single member as every installation before clusters runs it.
    fn start_legacy(&mut self) {
        let legacy = self.addresses.legacy_peer_url.clone();
        let (client, _, _) = self.ports[0];
        let mut c = self.command(0);
        c.arg("--name=kubevirt-etcd")
            .arg(format!(
                "--advertise-client-urls=https://127.0.0.1:{client}"
            ))
            .arg(format!("--listen-peer-urls={legacy}"))
            .arg(format!("--initial-advertise-peer-urls={legacy}"))
            .arg(format!("--initial-cluster=kubevirt-etcd={legacy}"));
        self.running.insert(0, c.spawn().unwrap());
    }

    /// Member `i` as the cluster's pod template runs it, `--initial-cluster(-state)` from the
    /// environment as the ConfigMap gives it for `replicas` members.
    fn start_member(&mut self, i: usize, replicas: i32) {
        let (cluster, state) = initial_cluster_of(&self.addresses.peer_urls, replicas);
        let (client, peer, _) = self.ports[i];
        let mut c = self.command(i);
        c.arg(format!("--name={}", member_name(i)))
            .arg(format!(
                "--advertise-client-urls=https://127.0.0.1:{client}"
            ))
            .arg(format!("--listen-peer-urls=https://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=https://127.0.0.1:{peer}"
            ))
            .arg("--initial-cluster-token=kubevirt-etcd")
            .arg(format!("--peer-cert-file={}", self.file("peer.crt")))
            .arg(format!("--peer-key-file={}", self.file("peer.key")))
            .arg(format!("--peer-trusted-ca-file={}", self.file("ca.crt")))
            .arg("--peer-client-cert-auth=true")
            .arg(format!("--peer-cert-allowed-cn={PEER_COMMON_NAME}"))
            .arg("--experimental-peer-skip-client-san-verification=true")
            .env("ETCD_INITIAL_CLUSTER", cluster)
            .env("ETCD_INITIAL_CLUSTER_STATE", state);
        self.running.insert(i, c.spawn().unwrap());
    }

    fn stop(&mut self, i: usize) {
        if let Some(mut c) = self.running.remove(&i) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log(&self) -> String {
        (0..3)
            .map(|i| {
                let text = std::fs::read_to_string(self.dir.path().join(format!("etcd-{i}.log")))
                    .unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "--- etcd-{i}\n{}",
                    lines[lines.len().saturating_sub(15)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn client(&self, i: usize) -> Client {
        let tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&self.tls.ca))
            .identity(etcd_client::Identity::from_pem(
                &self.tls.cert,
                &self.tls.key,
            ));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let c = Client::connect(
                [&self.addresses.client_urls[i]],
                Some(ConnectOptions::new().with_tls(tls.clone())),
            )
            .await;
            let why = match c {
                Ok(mut c) => match c.status().await {
                    Ok(_) => return c,
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "etcd member {i} does not answer: {why}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Plays virt-operator (observe, plan, execute) and the StatefulSet (pods 0..replicas run)
    /// until the membership has `desired` members and nothing is pending. Returns every step
    /// taken.
    async fn converge(&mut self, desired: usize) -> Vec<etcd_members::Step> {
        self.converge_leaving(desired, &mut BTreeSet::new()).await
    }

    /// [`Self::converge`] with the members of `leaving` on a node being drained: a member
    /// replaced (`Step::Replace`) loses its pod and volume, as the operator deletes them, and
    /// starts again empty "on another node" (no longer leaving).
    async fn converge_leaving(
        &mut self,
        desired: usize,
        leaving: &mut BTreeSet<usize>,
    ) -> Vec<etcd_members::Step> {
        let mut steps = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            assert!(
                Instant::now() < deadline,
                "no {desired} members after {steps:?}\n{}",
                self.log()
            );
            let (observed, mut client) =
                match etcd_members::observe(&self.addresses, Some(&self.tls), true).await {
                    Ok(o) => o,
                    Err(e) => {
                        eprintln!("observe: {e}");
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        continue;
                    }
                };
            let mut observed = observed;
            observed.leaving = leaving.clone();
            observed.room = true;
            let plan = etcd_members::plan(desired, &self.addresses, &observed);
            if let Some(step) = plan.step {
                match etcd_members::execute(&mut client, &self.addresses, step).await {
                    Ok(etcd_members::Outcome::Done) => {
                        steps.push(step);
                        if let etcd_members::Step::Replace { ordinal, .. } = step {
                            // The operator deletes its pod and claim: the StatefulSet
                            // starts it anew, empty, elsewhere.
                            self.stop(ordinal);
                            let data = self.dir.path().join(format!("data-{ordinal}"));
                            let _ = std::fs::remove_dir_all(data);
                            leaving.remove(&ordinal);
                        }
                    }
                    Ok(etcd_members::Outcome::NotYet(why)) => {
                        eprintln!("{step:?}: not yet: {why}");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                    Err(e) => panic!("{step:?}: {e}\n{}", self.log()),
                }
            }
            let replicas = usize::try_from(plan.replicas).unwrap();
            for i in replicas..3 {
                self.stop(i);
            }
            for i in 0..replicas {
                // kubelet restarts a member that exited (one that could not join yet).
                let exited = self
                    .running
                    .get_mut(&i)
                    .is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
                if exited {
                    self.running.remove(&i);
                    self.start_member(i, plan.replicas);
                }
            }
            if plan.step.is_none() && plan.pending.is_none() {
                return steps;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// Every member that runs holds `key` = `value` (read from its own store, not the leader's).
async fn everyone_has(e: &Etcd, key: &str, value: &str) {
    for &i in e.running.keys() {
        let mut c = e.client(i).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = c
                .get(key, Some(GetOptions::new().with_serializable()))
                .await
                .unwrap();
            if r.kvs().first().map(|kv| kv.value()) == Some(value.as_bytes()) {
                break;
            }
            assert!(Instant::now() < deadline, "member {i} lacks {key}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_member_grows_to_three_and_back_keeping_every_key() {
    let mut e = Etcd::new();
    e.start_legacy();
    e.client(0)
        .await
        .put("before", "the cluster", None)
        .await
        .unwrap();

    // The cluster's pod template replaces the single member's: same data, peer TLS, its
    // name from the pod; the loopback peer URL stays in etcd's membership until advertised.
    e.stop(0);
    e.start_member(0, 1);
    e.client(0).await;
    let t = Instant::now();
    let grown = e.converge(3).await;
    eprintln!("1 → 3 members: {:.1} s", t.elapsed().as_secs_f64());
    assert!(
        matches!(
            grown.as_slice(),
            [
                etcd_members::Step::AdvertisePeerUrl { .. },
                etcd_members::Step::AddLearner { ordinal: 1 },
                etcd_members::Step::Promote { ordinal: 1, .. },
                etcd_members::Step::AddLearner { ordinal: 2 },
                etcd_members::Step::Promote { ordinal: 2, .. },
            ]
        ),
        "{grown:?}"
    );
    let mut c = e.client(2).await;
    let members = c.member_list().await.unwrap();
    let voting: Vec<&str> = members
        .members()
        .iter()
        .filter(|m| !m.is_learner())
        .map(|m| m.name())
        .collect();
    assert_eq!(
        voting.len(),
        3,
        "{:?}",
        members
            .members()
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
    );
    everyone_has(&e, "before", "the cluster").await;
    c.put("grown", "to three", None).await.unwrap();
    everyone_has(&e, "grown", "to three").await;

    // One member down: the other two keep quorum and take writes.
    e.stop(1);
    e.client(0)
        .await
        .put("while", "one is down", None)
        .await
        .unwrap();
    e.start_member(1, 3);
    everyone_has(&e, "while", "one is down").await;

    // A member below the highest loses its volume for good: removed from etcd by hand
    // (docs/deploy.md), its pod comes back empty and the operator adds it again in its place.
    e.stop(1);
    std::fs::remove_dir_all(e.dir.path().join("data-1")).unwrap();
    let mut c = e.client(0).await;
    let lost = c
        .member_list()
        .await
        .unwrap()
        .members()
        .iter()
        .find(|m| m.name() == member_name(1))
        .map(|m| m.id())
        .unwrap();
    c.member_remove(lost).await.unwrap();
    e.start_member(1, 3);
    let readded = e.converge(3).await;
    assert!(
        matches!(
            readded.as_slice(),
            [
                etcd_members::Step::AddLearner { ordinal: 1 },
                etcd_members::Step::Promote { ordinal: 1, .. },
            ]
        ),
        "{readded:?}"
    );
    everyone_has(&e, "while", "one is down").await;

    let t = Instant::now();
    let shrunk = e.converge(1).await;
    eprintln!("3 → 1 member: {:.1} s", t.elapsed().as_secs_f64());
    assert!(
        matches!(
            shrunk.as_slice(),
            [
                etcd_members::Step::Remove { ordinal: 2, .. },
                etcd_members::Step::Remove { ordinal: 1, .. },
            ]
        ),
        "{shrunk:?}"
    );
    assert_eq!(e.running.keys().copied().collect::<Vec<_>>(), [0]);
    let mut c = e.client(0).await;
    assert_eq!(c.member_list().await.unwrap().members().len(), 1);
    for (k, v) in [
        ("before", "the cluster"),
        ("grown", "to three"),
        ("while", "one is down"),
    ] {
        let r = c.get(k, None).await.unwrap();
        assert_eq!(r.kvs()[0].value(), v.as_bytes());
    }
    c.put("after", "shrinking", None).await.unwrap();
}

/// Writes a key every 50 ms through a client of every member until stopped, each retried
/// for up to 5 s: returns (writes, writes that failed even so, the longest a write took).
fn writer(
    e: &Etcd,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64, Duration)> {
    let urls = e.addresses.client_urls.clone();
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(&e.tls.ca))
        .identity(etcd_client::Identity::from_pem(&e.tls.cert, &e.tls.key));
    tokio::spawn(async move {
        let opts = || {
            ConnectOptions::new()
                .with_tls(tls.clone())
                .with_timeout(Duration::from_secs(1))
                .with_connect_timeout(Duration::from_secs(1))
        };
        let mut client = Client::connect(&urls, Some(opts())).await.unwrap();
        let (mut writes, mut failed, mut longest) = (0u64, 0u64, Duration::ZERO);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            writes += 1;
            let t = Instant::now();
            let mut ok = false;
            while t.elapsed() < Duration::from_secs(5) {
                if client.put(format!("w/{writes}"), "x", None).await.is_ok() {
                    ok = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                if let Ok(c) = Client::connect(&urls, Some(opts())).await {
                    client = c;
                }
            }
            failed += u64::from(!ok);
            longest = longest.max(t.elapsed());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (writes, failed, longest)
    })
}

/// Issue 51: the single member of a new installation (a cluster of one) moves off a node
/// being drained while writes go on: a spare joins and is promoted, the member is replaced
/// by an empty one "elsewhere" that catches up and is promoted, and the spare leaves. Every
/// write succeeds (with retries) and every key is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_member_moves_off_a_drained_node_while_writes_go_on() {
    let mut e = Etcd::new();
    e.start_member(0, 1);
    e.client(0)
        .await
        .put("before", "the move", None)
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writes = writer(&e, stop.clone());
    let t = Instant::now();
    let steps = e.converge_leaving(1, &mut BTreeSet::from([0])).await;
    let took = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (n, failed, longest) = writes.await.unwrap();
    eprintln!(
        "moved the member in {:.1} s; {n} writes, {failed} failed, the longest {:?}",
        took.as_secs_f64(),
        longest
    );
    assert!(
        matches!(
            steps.as_slice(),
            [
                etcd_members::Step::AddLearner { ordinal: 1 },
                etcd_members::Step::Promote { ordinal: 1, .. },
                etcd_members::Step::Replace { ordinal: 0, .. },
                etcd_members::Step::Promote { ordinal: 0, .. },
                etcd_members::Step::Remove { ordinal: 1, .. },
            ]
        ),
        "{steps:?}"
    );
    assert_eq!(failed, 0, "writes failed while the member moved");
    assert!(n > 10, "the writer made only {n} writes");
    assert_eq!(e.running.keys().copied().collect::<Vec<_>>(), [0]);
    let mut c = e.client(0).await;
    assert_eq!(c.member_list().await.unwrap().members().len(), 1);
    assert_eq!(
        c.get("before", None).await.unwrap().kvs()[0].value(),
        b"the move"
    );
    assert_eq!(
        c.get(format!("w/{}", n - 1), None)
            .await
            .unwrap()
            .kvs()
            .len(),
        1,
        "the last write is there"
    );
}

/// Of three members, the one on the drained node is replaced in place; the other two keep
/// quorum throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_three_members_moves_off_a_drained_node_keeping_quorum() {
    let mut e = Etcd::new();
    e.start_member(0, 1);
    e.client(0).await;
    e.converge(3).await;
    e.client(0)
        .await
        .put("before", "the move", None)
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writes = writer(&e, stop.clone());
    let steps = e.converge_leaving(3, &mut BTreeSet::from([1])).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (n, failed, longest) = writes.await.unwrap();
    eprintln!("{n} writes, {failed} failed, the longest {longest:?}");
    assert!(
        matches!(
            steps.as_slice(),
            [
                etcd_members::Step::Replace { ordinal: 1, .. },
                etcd_members::Step::Promote { ordinal: 1, .. },
            ]
        ),
        "{steps:?}"
    );
    assert_eq!(failed, 0);
    everyone_has(&e, "before", "the move").await;
}
