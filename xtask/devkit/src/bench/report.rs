//! Pure helpers shared by the benchmarks: percentiles, formatting, machine description
//! and replacing one section of docs/benchmarks.md.

use std::time::Duration;

/// Nearest-rank percentile (`q` in 0..=100, clamped) of a sorted sample; `None` when
/// empty. Nearest rank rather than interpolation so every figure was actually observed.
pub fn percentile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let q = q.clamp(0.0, 100.0);
    // ceil(q/100 * n) is the 1-based rank; q = 0 means the minimum.
    let rank = ((q / 100.0) * n as f64).ceil() as usize;
    sorted.get(rank.clamp(1, n) - 1).copied()
}

/// p50/p99/max of a sample, formatted as "a / b / c ms" ("n/a" when empty).
pub fn p50_p99_max(samples: &[Duration]) -> String {
    let mut s = samples.to_vec();
    s.sort_unstable();
    match (percentile(&s, 50.0), percentile(&s, 99.0), s.last()) {
        (Some(a), Some(b), Some(c)) => format!("{} / {} / {}", ms(a), ms(b), ms(*c)),
        _ => "n/a".into(),
    }
}

/// p50/p99/max of signed nanoseconds (for intervals that can be negative).
pub fn p50_p99_max_ns(samples: &[i64]) -> String {
    let mut s = samples.to_vec();
    s.sort_unstable();
    let f = |ns: i64| ms_f(ns as f64 / 1e6);
    match (percentile(&s, 50.0), percentile(&s, 99.0), s.last()) {
        (Some(a), Some(b), Some(c)) => format!("{} / {} / {}", f(a), f(b), f(*c)),
        _ => "n/a".into(),
    }
}

/// Milliseconds with a precision that fits the magnitude.
pub fn ms(d: Duration) -> String {
    ms_f(d.as_secs_f64() * 1000.0)
}

fn ms_f(v: f64) -> String {
    let a = v.abs();
    if a < 10.0 {
        format!("{v:.2} ms")
    } else if a < 100.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.0} ms")
    }
}

/// The time now, as the figures' sections name it (`2026-12-01 22:40 UTC`).
pub fn now_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The workspace's commit (short hash, `+dirty` with uncommitted changes outside
/// docs/benchmarks.md), which a figure names so that it can be traced to the code it
/// measured.
pub fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(crate::workspace_root())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let hash = git(&["rev-parse", "--short", "HEAD"]);
    // docs/benchmarks.md itself does not count: `bench all` writes each section as its
    // step ends, and every later step then measured a "dirty" tree of the same code.
    if git(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        ":(exclude)docs/benchmarks.md",
    ])
    .is_empty()
    {
        hash
    } else {
        format!("{hash}+dirty")
    }
}

/// Bytes as KiB/MiB.
pub fn bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / f64::from(1u32 << 20))
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

fn is_fence(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("```") || t.starts_with("~~~")
}

/// Headings of level 1 or 2 end a section; deeper ones belong to it.
fn is_section_heading(line: &str) -> bool {
    line.starts_with("# ") || line.starts_with("## ")
}

/// Replaces the section that starts with the line `heading` (up to the next level-1/2
/// heading outside a code fence) with `section`, which must start with `heading`.
/// Appends the section when absent; creates a titled document when `doc` is empty.
/// Everything outside the section is kept byte for byte, because other benchmarks own it.
pub fn replace_section(doc: &str, heading: &str, section: &str) -> String {
    let section = format!("{}\n", section.trim_end());
    if doc.trim().is_empty() {
        return format!("# Benchmarks\n\n{section}");
    }
    let lines: Vec<&str> = doc.split_inclusive('\n').collect();
    let mut in_fence = false;
    let mut start = None;
    let mut end = lines.len();
    for (i, line) in lines.iter().enumerate() {
        if is_fence(line) {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let bare = line.trim_end_matches(['\n', '\r']);
        match start {
            None if bare.trim_end() == heading => start = Some(i),
            Some(_) if is_section_heading(bare) => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    match start {
        Some(s) => {
            let mut out: String = lines[..s].concat();
            out.push_str(&section);
            if end < lines.len() {
                // Keep one blank line before whoever's section follows.
                out.push('\n');
                out.push_str(&lines[end..].concat());
            }
            out
        }
        None => {
            let mut out = doc.trim_end().to_string();
            out.push_str("\n\n");
            out.push_str(&section);
            out
        }
    }
}

/// A short description of this machine for the benchmark record.
#[derive(Debug, Clone)]
pub struct Machine {
    /// CPUs available to this process.
    pub cpus: usize,
    /// CPU model from /proc/cpuinfo.
    pub cpu_model: String,
    /// MemTotal in bytes.
    pub mem_total: u64,
    /// Kernel release.
    pub kernel: String,
}

impl Machine {
    /// Reads /proc; unknown fields become "unknown".
    pub fn probe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Self {
            cpus: std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            cpu_model: cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".into()),
            mem_total: proc_kib(&meminfo, "MemTotal").unwrap_or(0) * 1024,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
        }
    }
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} CPUs ({}), {:.1} GiB RAM, Linux {}",
            self.cpus,
            self.cpu_model,
            self.mem_total as f64 / f64::from(1u32 << 30),
            self.kernel
        )
    }
}

/// The first "model name" of /proc/cpuinfo.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "model name").then(|| v.trim().to_string())
    })
}

/// A "Key:   123 kB" field of /proc/meminfo or /proc/<pid>/status, in KiB.
pub fn proc_kib(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        if k != key {
            return None;
        }
        v.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(ms: &[u64]) -> Vec<Duration> {
        let mut v: Vec<Duration> = ms.iter().map(|m| Duration::from_millis(*m)).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn percentile_nearest_rank() {
        let s = d(&[5, 1, 4, 2, 3]);
        assert_eq!(percentile(&s, 0.0), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&s, 50.0), Some(Duration::from_millis(3)));
        assert_eq!(percentile(&s, 99.0), Some(Duration::from_millis(5)));
        assert_eq!(percentile(&s, 100.0), Some(Duration::from_millis(5)));
        assert_eq!(percentile::<Duration>(&[], 50.0), None);
        assert_eq!(percentile(&d(&[7]), 99.0), Some(Duration::from_millis(7)));
    }

    #[test]
    fn percentile_of_hundred_is_exact_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&s, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&s, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&s, 99.5), Some(Duration::from_millis(100)));
        // Out-of-range q is clamped rather than panicking.
        assert_eq!(percentile(&s, 150.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&s, -1.0), Some(Duration::from_millis(1)));
    }

    #[test]
    fn summary_formats() {
        assert_eq!(p50_p99_max(&[]), "n/a");
        assert_eq!(p50_p99_max(&d(&[1, 2, 300])), "2.00 ms / 300 ms / 300 ms");
        assert_eq!(ms(Duration::from_micros(12_340)), "12.3 ms");
        assert_eq!(
            p50_p99_max_ns(&[-1_500_000, 2_000_000]),
            "-1.50 ms / 2.00 ms / 2.00 ms"
        );
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(2048), "2.0 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
    }

    const H: &str = "## mine";

    #[test]
    fn section_created_in_empty_doc() {
        assert_eq!(
            replace_section("", H, "## mine\nbody\n\n"),
            "# Benchmarks\n\n## mine\nbody\n"
        );
    }

    #[test]
    fn section_appended_when_absent() {
        let doc = "# Benchmarks\n\n## other\nx\n";
        assert_eq!(
            replace_section(doc, H, "## mine\nnew"),
            "# Benchmarks\n\n## other\nx\n\n## mine\nnew\n"
        );
    }

    #[test]
    fn section_replaced_in_the_middle_keeps_neighbours() {
        let doc = "# B\n\n## a\nA\n\n## mine\nold\n### sub\nold sub\n\n## z\nZ\n";
        assert_eq!(
            replace_section(doc, H, "## mine\nnew"),
            "# B\n\n## a\nA\n\n## mine\nnew\n\n## z\nZ\n"
        );
    }

    #[test]
    fn section_replaced_at_end() {
        let doc = "# B\n\n## a\nA\n\n## mine\nold\nmore\n";
        assert_eq!(
            replace_section(doc, H, "## mine\nnew\n"),
            "# B\n\n## a\nA\n\n## mine\nnew\n"
        );
    }

    #[test]
    fn headings_inside_fences_do_not_end_the_section() {
        let doc = "## mine\n```\n## not a heading\n```\nold\n## next\nN\n";
        assert_eq!(
            replace_section(doc, H, "## mine\nnew"),
            "## mine\nnew\n\n## next\nN\n"
        );
        // And a fenced copy of the heading elsewhere is not our section.
        let doc = "## a\n```\n## mine\n```\n";
        assert_eq!(
            replace_section(doc, H, "## mine\nnew"),
            "## a\n```\n## mine\n```\n\n## mine\nnew\n"
        );
    }

    #[test]
    fn similar_heading_is_not_ours() {
        let doc = "## mine too\nkeep\n";
        assert_eq!(
            replace_section(doc, H, "## mine\nnew"),
            "## mine too\nkeep\n\n## mine\nnew\n"
        );
    }

    #[test]
    fn proc_parsing() {
        let status = "Name:\tvirt-apiserver\nVmHWM:\t   12345 kB\nVmRSS:\t  1000 kB\n";
        assert_eq!(proc_kib(status, "VmHWM"), Some(12345));
        assert_eq!(proc_kib(status, "VmRSS"), Some(1000));
        assert_eq!(proc_kib(status, "VmSwap"), None);
        let cpu = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: x\n";
        assert_eq!(cpu_model(cpu).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(cpu_model(""), None);
    }
}
