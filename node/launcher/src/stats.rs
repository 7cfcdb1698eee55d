//! The running domain's statistics, read in-process (`virDomainListGetStats` through
//! `virt-domstats`) on a thread of their own with a libvirt connection of their own.
//!
//! **Why a thread of its own:** the call can block as long as QEMU does not answer its
//! monitor; on the libvirt thread (actor.rs) that would also stop the state polling, the
//! actions and a migration's cancel. Here only this thread waits: the caller gives up after
//! its timeout (a scrape is never held), requests whose caller gave up are skipped, and
//! while the thread is stuck new ones are refused at once rather than queued without end.
//! **Why its own connection:** the libvirt thread's connection is that thread's to close at
//! its cleanup, and one that broke here is dropped and reopened without touching it.
//! `VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT` keeps a domain busy in a job (a migration)
//! from making the call wait for that job: it answers what needs no job.

use std::sync::mpsc;

use tokio::sync::oneshot;
use virt::connect::Connect;
use virt::domain::Domain;
use virt::sys;
use virt_domain::stats::{DomainStats, stats_from_fields};

use crate::actor::{LibvirtError, StatsSource};

/// The families KubeVirt's metrics read (what `virsh domstats --cpu-total --balloon
/// --vcpu --interface --block --dirtyrate` asks for): no perf events, no IOThreads.
const FAMILIES: u32 = sys::VIR_DOMAIN_STATS_CPU_TOTAL
    | sys::VIR_DOMAIN_STATS_BALLOON
    | sys::VIR_DOMAIN_STATS_VCPU
    | sys::VIR_DOMAIN_STATS_INTERFACE
    | sys::VIR_DOMAIN_STATS_BLOCK
    | sys::VIR_DOMAIN_STATS_DIRTYRATE;

/// Seconds one dirty-rate measurement samples the guest's memory (KubeVirt's: 1 s).
const DIRTY_RATE_PERIOD: i32 = 1;

/// Requests that may wait behind the one being read. Scrapes come one at a time per
/// launcher; more waiting means the thread is stuck.
const QUEUE: usize = 4;

const OP: &str = "domain stats";

/// What one read on the statistics thread gives: libvirt's parameters by name, each value
/// as virsh prints it, and the vCPUs' CPU affinity count.
struct Fields {
    fields: Vec<(String, String)>,
    cpu_affinity: Option<u64>,
}

/// Sends reads to the statistics thread; the thread ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct StatsReader {
    tx: mpsc::SyncSender<Request>,
}

struct Request {
    uri: String,
    domain: String,
    reply: oneshot::Sender<Result<Fields, LibvirtError>>,
}

impl StatsReader {
    /// Starts the thread (it connects at its first read).
    pub fn spawn() -> Result<Self, LibvirtError> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("libvirt-stats".into())
            .spawn(move || serve(&rx))
            .map_err(|e| LibvirtError::Call {
                op: "spawn statistics thread",
                message: e.to_string(),
            })?;
        Ok(Self { tx })
    }

    /// The statistics of the domain `src` names, with its device aliases and migration
    /// figures. Waits as long as the caller does (dropping this future abandons the read).
    pub async fn read(&self, src: &StatsSource) -> Result<DomainStats, LibvirtError> {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            uri: src.uri.clone(),
            domain: src.domain.clone(),
            reply,
        };
        self.tx.try_send(request).map_err(|e| match e {
            mpsc::TrySendError::Full(_) => LibvirtError::Call {
                op: OP,
                message: "earlier statistics reads have not returned (QEMU not answering?)".into(),
            },
            mpsc::TrySendError::Disconnected(_) => LibvirtError::Gone,
        })?;
        let read = answer.await.map_err(|_| LibvirtError::Gone)??;
        let mut stats = stats_from_fields(read.fields, &src.aliases);
        stats.migration = src.migration.clone();
        stats.cpu_affinity = read.cpu_affinity;
        Ok(stats)
    }
}

fn serve(rx: &mpsc::Receiver<Request>) {
    let mut session: Option<Session> = None;
    for req in rx {
        // Its caller gave up while an earlier read held this thread.
        if req.reply.is_closed() {
            continue;
        }
        let res = read(&mut session, &req.uri, &req.domain);
        if res.is_err() {
            // Reopened at the next read: the daemon may have restarted or the connection
            // broken, and a fresh lookup finds a domain defined anew.
            session = None;
        }
        let _ = req.reply.send(res);
    }
}

/// The thread's connection and the domain last read on it.
struct Session {
    uri: String,
    conn: Connect,
    domain: Option<(String, Domain)>,
    /// The host's CPUs (the length of a vCPU's affinity map).
    host_cpus: Option<usize>,
    /// A dirty-rate measurement was refused (an old QEMU): not asked again on this
    /// connection.
    no_dirty_rate: bool,
}

fn read(session: &mut Option<Session>, uri: &str, name: &str) -> Result<Fields, LibvirtError> {
    if uri.is_empty() {
        // libvirt would pick a default hypervisor: never what the launcher runs.
        return Err(LibvirtError::Call {
            op: OP,
            message: "no libvirt URI".into(),
        });
    }
    if session.as_ref().is_none_or(|s| s.uri != uri) {
        *session = Some(Session {
            uri: uri.to_string(),
            conn: crate::actor::call("connect (statistics)", Connect::open(Some(uri)))?,
            domain: None,
            host_cpus: None,
            no_dirty_rate: false,
        });
    }
    let Some(s) = session.as_mut() else {
        return Err(LibvirtError::Gone);
    };
    let domain = match s.domain.take() {
        Some((n, d)) if n == name => d,
        _ => crate::actor::call("domain lookup", s.conn.lookup_domain_by_name(name))?,
    };
    let fields = virt_domstats::domain_stats(
        &domain,
        FAMILIES,
        sys::VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT,
    );
    let fields: Vec<(String, String)> = match fields {
        Ok(f) => f.into_iter().map(|(k, v)| (k, v.to_string())).collect(),
        Err(e) => {
            s.domain = Some((name.to_string(), domain));
            return Err(LibvirtError::Call {
                op: OP,
                message: e.to_string(),
            });
        }
    };
    next_dirty_rate(s, &domain, &fields);
    let cpu_affinity = cpu_affinity(s, &domain, &fields);
    s.domain = Some((name.to_string(), domain));
    Ok(Fields {
        fields,
        cpu_affinity,
    })
}

/// Starts the next dirty-rate measurement unless one is running, so the next read has a
/// rate at most a period old; a read never waits for one (KubeVirt's launcher samples for
/// a second inside the scrape).
fn next_dirty_rate(s: &mut Session, domain: &Domain, fields: &[(String, String)]) {
    let measuring = fields
        .iter()
        .any(|(k, v)| k == "dirtyrate.calc_status" && v == "1");
    if measuring || s.no_dirty_rate {
        return;
    }
    if let Err(e) = virt_domstats::start_dirty_rate_calc(domain, DIRTY_RATE_PERIOD) {
        tracing::debug!(error = %e, "no dirty-rate measurement on this connection");
        s.no_dirty_rate = true;
    }
}

/// The set bits of the vCPUs' affinity maps, as KubeVirt counts them; `None` when libvirt
/// does not say.
fn cpu_affinity(s: &mut Session, domain: &Domain, fields: &[(String, String)]) -> Option<u64> {
    let vcpus: usize = fields
        .iter()
        .find(|(k, _)| k == "vcpu.current")
        .and_then(|(_, v)| v.parse().ok())?;
    if s.host_cpus.is_none() {
        s.host_cpus = s.conn.node_info().ok().map(|n| n.cpus as usize);
    }
    let maps = virt_domstats::vcpu_pin_info(domain, vcpus, s.host_cpus?).ok()?;
    Some(maps.iter().flatten().filter(|b| **b).count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libvirt's test driver stands in for the launcher's daemon (no daemon needed; its
    /// domain reports no family the metrics read, so the statistics are empty).
    #[tokio::test]
    async fn reads_go_through_the_thread_and_failures_are_errors() {
        virt::error::clear_error_callback();
        let reader = StatsReader::spawn().expect("thread");
        let src = |uri: &str, domain: &str| StatsSource {
            uri: uri.into(),
            domain: domain.into(),
            ..StatsSource::default()
        };
        let s = reader
            .read(&src("test:///default", "test"))
            .await
            .expect("test domain");
        assert_eq!(s, DomainStats::default());
        let e = reader
            .read(&src("test:///default", "no-such-domain"))
            .await
            .expect_err("no such domain");
        assert!(e.to_string().contains("domain lookup"), "{e}");
        let e = reader.read(&src("", "test")).await.expect_err("no URI");
        assert!(e.to_string().contains("no libvirt URI"), "{e}");
        // After errors (the session dropped) the next read reconnects.
        assert!(reader.read(&src("test:///default", "test")).await.is_ok());
    }

    /// A read whose caller gave up is not made, and a stuck thread refuses at once
    /// instead of queueing without end.
    #[tokio::test]
    async fn a_full_queue_is_refused_at_once() {
        // No thread: nothing is ever taken off the queue.
        let (tx, _rx) = mpsc::sync_channel(QUEUE);
        let reader = StatsReader { tx };
        let src = StatsSource {
            uri: "test:///default".into(),
            domain: "test".into(),
            ..StatsSource::default()
        };
        for _ in 0..QUEUE {
            let pending =
                tokio::time::timeout(std::time::Duration::from_millis(10), reader.read(&src)).await;
            assert!(pending.is_err(), "queued, waiting");
        }
        let e = reader.read(&src).await.expect_err("full");
        assert!(e.to_string().contains("have not returned"), "{e}");
    }
}
