//! Progress: the download and the conversion each count half of it, so that 100 % means
//! done (CDI's imports "stuck at 99 %" are its invisible conversion, CDI#3537). A raw image
//! has no conversion: its download is all of it. Written as JSON to `--progress-file`
//! (atomically, at most twice a second) and logged now and then.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

/// What the importer is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Phase {
    Downloading,
    /// A clone reads its source claim.
    Copying,
    Converting,
    Completed,
    Failed,
}

/// Overall progress in percent, from the download's and the conversion's fractions (0..=1).
/// None while the download's size is unknown (no Content-Length) and nothing is converted yet.
pub fn overall(conversion_needed: bool, download: Option<f64>, conversion: f64) -> Option<f64> {
    let clamp = |f: f64| f.clamp(0.0, 1.0);
    let percent = if conversion_needed {
        let download = if conversion > 0.0 {
            Some(download.map_or(1.0, clamp))
        } else {
            download.map(clamp)
        };
        50.0 * download? + 50.0 * clamp(conversion)
    } else {
        100.0 * clamp(download?)
    };
    // Two decimals, as CDI's "37.42%".
    Some((percent * 100.0).floor() / 100.0)
}

/// The download's fraction: received of the expected length.
pub fn fraction(done: u64, total: Option<u64>) -> Option<f64> {
    match total {
        Some(0) => Some(1.0),
        Some(t) => Some(done as f64 / t as f64),
        None => None,
    }
}

/// One report, as written to the progress file.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub phase: Phase,
    /// Percent, two decimals; null when the source's size is unknown.
    pub progress: Option<f64>,
    /// Bytes received from the source.
    pub received: u64,
    /// The source's Content-Length.
    pub total: Option<u64>,
    /// The sniffed format, once known.
    pub format: Option<&'static str>,
}

/// The progress tracker of one import.
#[derive(Debug)]
pub struct Progress {
    file: Option<PathBuf>,
    last_write: Option<Instant>,
    last_log: Option<Instant>,
    pub report: Report,
    conversion_needed: bool,
    conversion: f64,
}

const WRITE_EVERY: Duration = Duration::from_millis(500);
const LOG_EVERY: Duration = Duration::from_secs(10);

impl Progress {
    pub fn new(file: Option<PathBuf>) -> Self {
        Progress {
            file,
            last_write: None,
            last_log: None,
            report: Report {
                phase: Phase::Downloading,
                progress: Some(0.0),
                received: 0,
                total: None,
                format: None,
            },
            conversion_needed: false,
            conversion: 0.0,
        }
    }

    pub fn set_total(&mut self, total: Option<u64>) {
        self.report.total = total;
        self.recompute();
    }

    pub fn set_format(&mut self, name: &'static str, conversion_needed: bool) {
        self.report.format = Some(name);
        self.conversion_needed = conversion_needed;
        self.recompute();
        self.flush(true);
    }

    /// A clone of `total` bytes starts: a raw copy, nothing to convert.
    pub fn copying(&mut self, total: u64) {
        self.report.phase = Phase::Copying;
        self.report.total = Some(total);
        self.report.format = Some("raw");
        self.conversion_needed = false;
        self.recompute();
        self.flush(true);
    }

    pub fn received(&mut self, n: u64) {
        self.report.received += n;
        self.recompute();
        self.flush(false);
    }

    pub fn converting(&mut self, fraction: f64) {
        self.report.phase = Phase::Converting;
        self.conversion = fraction;
        self.recompute();
        self.flush(fraction == 0.0);
    }

    pub fn finish(&mut self, ok: bool) {
        if ok {
            self.report.phase = Phase::Completed;
            self.report.progress = Some(100.0);
        } else {
            self.report.phase = Phase::Failed;
        }
        self.flush(true);
    }

    fn recompute(&mut self) {
        let download = fraction(self.report.received, self.report.total);
        self.report.progress = overall(self.conversion_needed, download, self.conversion);
    }

    fn flush(&mut self, force: bool) {
        let now = Instant::now();
        if force || self.last_log.is_none_or(|t| now - t >= LOG_EVERY) {
            self.last_log = Some(now);
            tracing::info!(
                phase = ?self.report.phase,
                progress = ?self.report.progress,
                received = self.report.received,
                total = ?self.report.total,
                "progress"
            );
        }
        let Some(file) = &self.file else { return };
        if !force && self.last_write.is_some_and(|t| now - t < WRITE_EVERY) {
            return;
        }
        self.last_write = Some(now);
        // A reader never sees a half-written file: write beside it, then rename.
        let mut tmp = file.clone().into_os_string();
        tmp.push(".tmp");
        let written = serde_json::to_vec(&self.report)
            .map_err(std::io::Error::other)
            .and_then(|json| std::fs::write(&tmp, json))
            .and_then(|()| std::fs::rename(&tmp, file));
        if let Err(e) = written {
            // Progress is a convenience; the import goes on.
            tracing::warn!(file = %file.display(), error = %e, "cannot write the progress file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_download_is_everything() {
        assert_eq!(overall(false, Some(0.0), 0.0), Some(0.0));
        assert_eq!(overall(false, Some(0.5), 0.0), Some(50.0));
        assert_eq!(overall(false, Some(1.0), 0.0), Some(100.0));
        assert_eq!(overall(false, None, 0.0), None);
        // Never past 100 (a server sending more than it announced).
        assert_eq!(overall(false, Some(1.5), 0.0), Some(100.0));
    }

    #[test]
    fn conversion_is_the_second_half() {
        assert_eq!(overall(true, Some(0.5), 0.0), Some(25.0));
        assert_eq!(overall(true, Some(1.0), 0.0), Some(50.0));
        assert_eq!(overall(true, Some(1.0), 0.5), Some(75.0));
        assert_eq!(overall(true, Some(1.0), 1.0), Some(100.0));
        // Size unknown: unknown while downloading, known once converting (the download is over).
        assert_eq!(overall(true, None, 0.0), None);
        assert_eq!(overall(true, None, 0.25), Some(62.5));
    }

    #[test]
    fn two_decimals_rounded_down() {
        // 1/3 → 33.33, never 100 before the end.
        assert_eq!(overall(false, Some(1.0 / 3.0), 0.0), Some(33.33));
        assert_eq!(overall(false, Some(0.999_99), 0.0), Some(99.99));
    }

    #[test]
    fn fractions() {
        assert_eq!(fraction(5, Some(10)), Some(0.5));
        assert_eq!(fraction(0, Some(0)), Some(1.0));
        assert_eq!(fraction(5, None), None);
    }

    #[test]
    fn file_is_json() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("progress.json");
        let mut p = Progress::new(Some(file.clone()));
        p.set_total(Some(200));
        p.set_format("qcow2", true);
        p.received(100);
        p.converting(0.0);
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(v["phase"], "Converting");
        assert_eq!(v["progress"], 25.0);
        assert_eq!(v["format"], "qcow2");
        p.finish(true);
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(v["phase"], "Completed");
        assert_eq!(v["progress"], 100.0);
    }
}
