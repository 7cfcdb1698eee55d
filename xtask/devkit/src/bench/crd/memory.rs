//! Memory of the four processes (RSS from /proc/<pid>/status, the etcds' database from
//! their metrics), sampled at the same moments for both sides, and a settle rule so a
//! figure is read once the processes have stopped moving rather than mid-collection.

use std::time::{Duration, Instant};

use super::harness::Procs;
use crate::bench::apiserver::status_kib;

/// The processes, in the order of [`Sample::rss_kib`].
pub const NAMES: [&str; 4] = [
    "kube-apiserver",
    "etcd A (kube-apiserver's)",
    "virt-apiserver",
    "etcd B (virt-apiserver's)",
];

/// Samples one second apart that must agree before memory counts as settled.
const WINDOW: usize = 5;
/// How long to wait for them before taking what there is (and saying so).
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// One reading of everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    /// VmRSS in KiB, in [`NAMES`]' order.
    pub rss_kib: [u64; 4],
    /// `etcd_mvcc_db_total_size_in_use_in_bytes` of etcd A and etcd B.
    pub db_in_use: [u64; 2],
}

/// A settled reading: the median of the last [`WINDOW`] samples.
#[derive(Debug, Clone, Copy, Default)]
pub struct Settled {
    pub sample: Sample,
    /// False when [`SETTLE_LIMIT`] passed first.
    pub stable: bool,
}

/// Growth per object between two settled readings, in bytes (negative when a process
/// gave memory back).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PerObject {
    pub rss: [f64; 4],
    pub db_in_use: [f64; 2],
}

impl PerObject {
    pub fn between(before: &Sample, after: &Sample, objects: usize) -> Self {
        let n = objects.max(1) as f64;
        let grow = |b: u64, a: u64| (a as f64 - b as f64) / n;
        Self {
            rss: std::array::from_fn(|i| grow(before.rss_kib[i], after.rss_kib[i]) * 1024.0),
            db_in_use: std::array::from_fn(|i| grow(before.db_in_use[i], after.db_in_use[i])),
        }
    }

    pub fn rss_total(&self) -> f64 {
        self.rss.iter().sum()
    }
}

/// Reads all four processes now.
pub async fn sample(procs: &Procs, http: &reqwest::Client) -> anyhow::Result<Sample> {
    let pids = [
        procs.kube_apiserver,
        procs.etcd_a,
        procs.virt_apiserver,
        procs.etcd_b,
    ];
    let mut rss_kib = [0; 4];
    for (slot, pid) in rss_kib.iter_mut().zip(pids) {
        *slot = status_kib(pid, "VmRSS")
            .ok_or_else(|| anyhow::anyhow!("no VmRSS for pid {pid}: has it exited?"))?;
    }
    Ok(Sample {
        rss_kib,
        db_in_use: [
            db_in_use(http, &procs.etcd_a_url).await?,
            db_in_use(http, &procs.etcd_b_url).await?,
        ],
    })
}

async fn db_in_use(http: &reqwest::Client, etcd: &str) -> anyhow::Result<u64> {
    let text = http
        .get(format!("{etcd}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let name = "etcd_mvcc_db_total_size_in_use_in_bytes";
    gauge(&text, name)
        .map(|v| v as u64)
        .ok_or_else(|| anyhow::anyhow!("no {name} in {etcd}/metrics"))
}

/// The value of an unlabelled gauge in Prometheus' text format.
pub fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Waits `wait`, then samples every second until the last [`WINDOW`] samples agree.
pub async fn settle(
    procs: &Procs,
    http: &reqwest::Client,
    wait: Duration,
) -> anyhow::Result<Settled> {
    tokio::time::sleep(wait).await;
    let start = Instant::now();
    let mut window: Vec<Sample> = Vec::new();
    loop {
        window.push(sample(procs, http).await?);
        if window.len() > WINDOW {
            window.remove(0);
        }
        let stable = window.len() == WINDOW && agree(&window);
        if stable || start.elapsed() >= SETTLE_LIMIT {
            return Ok(Settled {
                sample: median(&window),
                stable,
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Whether every process's RSS stayed within 512 KiB or 0.5 % (whichever is larger) over
/// the samples: a Go heap being scavenged moves by more, an idle one by less.
pub fn agree(samples: &[Sample]) -> bool {
    (0..4).all(|i| {
        let values = samples.iter().map(|s| s.rss_kib[i]);
        let (lo, hi) = (values.clone().min(), values.max());
        match (lo, hi) {
            (Some(lo), Some(hi)) => hi - lo <= (hi / 200).max(512),
            _ => false,
        }
    })
}

/// Field by field median (the lower middle), so one odd sample does not decide.
pub fn median(samples: &[Sample]) -> Sample {
    let mid = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
    };
    Sample {
        rss_kib: std::array::from_fn(|i| mid(samples.iter().map(|s| s.rss_kib[i]).collect())),
        db_in_use: std::array::from_fn(|i| mid(samples.iter().map(|s| s.db_in_use[i]).collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(rss: u64) -> Sample {
        Sample {
            rss_kib: [rss, 100, 100, 100],
            db_in_use: [0, 0],
        }
    }

    #[test]
    fn gauges_are_read_without_labels_or_comments() {
        let text = "# HELP etcd_mvcc_db_total_size_in_use_in_bytes x\n\
                    # TYPE etcd_mvcc_db_total_size_in_use_in_bytes gauge\n\
                    etcd_mvcc_db_total_size_in_use_in_bytes_other 7\n\
                    etcd_mvcc_db_total_size_in_use_in_bytes 2.62144e+06\n";
        assert_eq!(
            gauge(text, "etcd_mvcc_db_total_size_in_use_in_bytes"),
            Some(2_621_440.0)
        );
        assert_eq!(gauge(text, "missing"), None);
    }

    #[test]
    fn settled_means_within_half_a_percent_or_512_kib() {
        assert!(agree(&[s(1000), s(1400), s(1200)]));
        assert!(!agree(&[s(1000), s(1600)]));
        assert!(agree(&[s(400_000), s(401_900)]));
        assert!(!agree(&[s(400_000), s(402_100)]));
        assert!(!agree(&[]));
    }

    #[test]
    fn median_and_growth_per_object() {
        let m = median(&[s(30), s(10), s(20), s(40)]);
        assert_eq!(m.rss_kib[0], 20);
        let before = Sample {
            rss_kib: [1000, 10, 10, 10],
            db_in_use: [4096, 0],
        };
        let after = Sample {
            rss_kib: [2000, 10, 0, 10],
            db_in_use: [4096, 8192],
        };
        let p = PerObject::between(&before, &after, 4);
        assert_eq!(p.rss, [256_000.0, 0.0, -2560.0, 0.0]);
        assert_eq!(p.db_in_use, [0.0, 2048.0]);
        assert_eq!(p.rss_total(), 253_440.0);
    }
}
