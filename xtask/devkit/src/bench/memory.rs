//! Memory of a benchmark's processes (RSS from /proc/<pid>/status, each etcd's database
//! from its metrics), sampled at the same moments, and a settle rule so a figure is read
//! once the processes have stopped moving rather than mid-collection. Used by
//! `bench crd` (four processes, two etcds) and `bench apiserver` (two and one).

use std::time::{Duration, Instant};

use crate::bench::apiserver::status_kib;

/// Samples one second apart that must agree before memory counts as settled.
const WINDOW: usize = 5;
/// How long to wait for them before taking what there is (and saying so).
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// What is read: `P` processes and `D` etcds.
#[derive(Debug, Clone)]
pub struct Watched<const P: usize, const D: usize> {
    pub pids: [u32; P],
    /// Each etcd's client URL, for `/metrics`.
    pub etcd_urls: [String; D],
}

/// One reading of everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample<const P: usize, const D: usize> {
    /// VmRSS in KiB, in [`Watched::pids`]' order.
    pub rss_kib: [u64; P],
    /// `etcd_mvcc_db_total_size_in_use_in_bytes` of each etcd.
    pub db_in_use: [u64; D],
}

impl<const P: usize, const D: usize> Default for Sample<P, D> {
    fn default() -> Self {
        Self {
            rss_kib: [0; P],
            db_in_use: [0; D],
        }
    }
}

/// A settled reading: the median of the last [`WINDOW`] samples.
#[derive(Debug, Clone, Copy, Default)]
pub struct Settled<const P: usize, const D: usize> {
    pub sample: Sample<P, D>,
    /// False when [`SETTLE_LIMIT`] passed first.
    pub stable: bool,
}

/// Growth per object between two settled readings, in bytes (negative when a process
/// gave memory back).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerObject<const P: usize, const D: usize> {
    pub rss: [f64; P],
    pub db_in_use: [f64; D],
}

impl<const P: usize, const D: usize> Default for PerObject<P, D> {
    fn default() -> Self {
        Self {
            rss: [0.0; P],
            db_in_use: [0.0; D],
        }
    }
}

impl<const P: usize, const D: usize> PerObject<P, D> {
    pub fn between(before: &Sample<P, D>, after: &Sample<P, D>, objects: usize) -> Self {
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

/// Reads every process and etcd now.
pub async fn sample<const P: usize, const D: usize>(
    w: &Watched<P, D>,
    http: &reqwest::Client,
) -> anyhow::Result<Sample<P, D>> {
    let mut rss_kib = [0; P];
    for (slot, pid) in rss_kib.iter_mut().zip(w.pids) {
        *slot = status_kib(pid, "VmRSS")
            .ok_or_else(|| anyhow::anyhow!("no VmRSS for pid {pid}: has it exited?"))?;
    }
    let mut db = [0; D];
    for (slot, url) in db.iter_mut().zip(&w.etcd_urls) {
        *slot = db_in_use(http, url).await?;
    }
    Ok(Sample {
        rss_kib,
        db_in_use: db,
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
pub async fn settle<const P: usize, const D: usize>(
    w: &Watched<P, D>,
    http: &reqwest::Client,
    wait: Duration,
) -> anyhow::Result<Settled<P, D>> {
    tokio::time::sleep(wait).await;
    let start = Instant::now();
    let mut window: Vec<Sample<P, D>> = Vec::new();
    loop {
        window.push(sample(w, http).await?);
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
pub fn agree<const P: usize, const D: usize>(samples: &[Sample<P, D>]) -> bool {
    (0..P).all(|i| {
        let values = samples.iter().map(|s| s.rss_kib[i]);
        let (lo, hi) = (values.clone().min(), values.max());
        match (lo, hi) {
            (Some(lo), Some(hi)) => hi - lo <= (hi / 200).max(512),
            _ => false,
        }
    })
}

/// Field by field median (the lower middle), so one odd sample does not decide.
pub fn median<const P: usize, const D: usize>(samples: &[Sample<P, D>]) -> Sample<P, D> {
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

    fn s(rss: u64) -> Sample<4, 2> {
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
        assert!(!agree::<4, 2>(&[]));
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
