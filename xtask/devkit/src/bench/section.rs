//! The discipline every figure in docs/benchmarks.md follows, in one place: a generated
//! section names its command, commit, date and machine ([`Provenance`]), sits between
//! markers that only code writes ([`Section`], [`replace_generated`]), and a figure
//! measured over several runs is their median with min–max ([`Runs`]). Hand-written notes
//! live outside the markers and survive every rewrite.

use std::time::Duration;

use super::report::{Machine, percentile};

/// Where a generated section lives in docs/benchmarks.md and how to regenerate it. The
/// order of [`SLOTS`] is the document's order, so `bench all` rebuilds it the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Marker key, stable across heading rewordings.
    pub key: &'static str,
    /// Heading text (level 2).
    pub title: &'static str,
    /// What regenerates it, for placeholders.
    pub command: &'static str,
}

pub const APISERVER: Slot = Slot {
    key: "apiserver",
    title: "virt-apiserver (cargo xtask bench apiserver)",
    command: "cargo xtask bench apiserver",
};
pub const ABUSE: Slot = Slot {
    key: "abuse",
    title: "virt-apiserver under abuse: a normal client's latency (cargo xtask bench abuse)",
    command: "cargo xtask bench abuse",
};
pub const LAUNCHER: Slot = Slot {
    key: "launcher",
    title: "Launcher (TCG, busybox guest, same run)",
    command: "cargo xtask bench launcher",
};
pub const CRD: Slot = Slot {
    key: "apiserver-vs-crd",
    title: "virt-apiserver vs a CRD, through one kube-apiserver (cargo xtask bench crd)",
    command: "cargo xtask bench crd",
};
pub const START: Slot = Slot {
    key: "start",
    title: "VM start, step by step, and density (cargo xtask bench start)",
    command: "cargo xtask bench start",
};
pub const START_DEBIAN: Slot = Slot {
    key: "start-debian",
    title: "A Debian 12 guest: start, guest agent, the agent's CPU (cargo xtask bench start --guest debian)",
    command: "cargo xtask bench start --guest debian",
};
pub const MIGRATE: Slot = Slot {
    key: "migrate",
    title: "Live migration (cargo xtask bench migrate)",
    command: "cargo xtask bench migrate",
};
pub const NETWORK: Slot = Slot {
    key: "network",
    title: "Pod network (cargo xtask bench network)",
    command: "cargo xtask bench network",
};
pub const PORT_FORWARD: Slot = Slot {
    key: "port-forward",
    title: "Port-forward through the API server (local cluster)",
    command: "cargo xtask bench port-forward",
};
pub const DRAIN: Slot = Slot {
    key: "drain",
    title: "Node drain (cargo xtask bench drain)",
    command: "cargo xtask bench drain",
};
pub const ETCD_DRAIN: Slot = Slot {
    key: "etcd-drain",
    title: "Draining the node that holds etcd (cargo xtask bench etcd-drain)",
    command: "cargo xtask bench etcd-drain",
};
pub const INSTANCETYPE: Slot = Slot {
    key: "instancetype",
    title: "A VM sized by an instance type against one written out (cargo xtask bench instancetype)",
    command: "cargo xtask bench instancetype",
};
pub const STORAGE: Slot = Slot {
    key: "storage",
    title: "Persistent disks (cargo xtask bench storage)",
    command: "cargo xtask bench storage",
};
pub const SCALE: Slot = Slot {
    key: "scale",
    title: "Control plane at scale on fake nodes (cargo xtask bench scale)",
    command: "cargo xtask bench scale",
};
pub const POOL: Slot = Slot {
    key: "pool",
    title: "kubectl scale of a VirtualMachinePool on fake nodes (cargo xtask bench pool)",
    command: "cargo xtask bench pool",
};
pub const SCRAPE: Slot = Slot {
    key: "scrape",
    title: "A Prometheus scrape of virt-handler with N running VMs (cargo xtask bench scrape)",
    command: "cargo xtask bench scrape",
};
pub const HOTPLUG: Slot = Slot {
    key: "hotplug",
    title: "Volume hotplug: addvolume to Ready, removevolume to gone (cargo xtask bench hotplug)",
    command: "cargo xtask bench hotplug",
};
pub const ALL: Slot = Slot {
    key: "all",
    title: "The last full run (cargo xtask bench all)",
    command: "cargo xtask bench all",
};

/// Every generated section, in the document's order: what `bench all`'s plan and the
/// checked-in document are tested against.
#[cfg(test)]
pub const SLOTS: [Slot; 18] = [
    ALL,
    APISERVER,
    ABUSE,
    CRD,
    SCALE,
    POOL,
    LAUNCHER,
    START,
    START_DEBIAN,
    MIGRATE,
    STORAGE,
    NETWORK,
    PORT_FORWARD,
    DRAIN,
    ETCD_DRAIN,
    INSTANCETYPE,
    SCRAPE,
    HOTPLUG,
];

/// What a reader needs to trust or reproduce a figure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    /// The exact command, every option spelt out.
    pub command: String,
    /// Short hash, `+dirty` with uncommitted changes.
    pub commit: String,
    /// `2026-12-01 22:40 UTC`.
    pub date: String,
    /// [`Machine`]'s description.
    pub machine: String,
}

impl Provenance {
    /// This workspace's commit, this machine, now.
    pub fn probe(command: String) -> Self {
        Self {
            command,
            commit: super::report::commit(),
            date: super::report::now_utc(),
            machine: Machine::probe().to_string(),
        }
    }

    /// One line, the same in every section so that a reader (or a script) finds it.
    pub fn render(&self) -> String {
        format!(
            "Command: `{}` · commit {} · {} · machine: {}",
            self.command, self.commit, self.date, self.machine
        )
    }
}

/// One generated section: heading, provenance line, then what the benchmark wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub slot: Slot,
    pub provenance: Provenance,
    /// Method and figures; no heading of level 1 or 2.
    pub body: String,
}

impl Section {
    pub fn new(slot: Slot, provenance: Provenance, body: impl Into<String>) -> Self {
        Self {
            slot,
            provenance,
            body: body.into(),
        }
    }

    /// The section with its markers, ending in a newline.
    pub fn render(&self) -> String {
        wrap(
            self.slot,
            &format!("{}\n\n{}", self.provenance.render(), self.body.trim()),
        )
    }
}

/// A section with no figures: why, and the command that would produce them.
pub fn not_measured(slot: Slot, reason: &str) -> String {
    let or_all = if slot == ALL {
        ""
    } else {
        " (or `cargo xtask bench all`)"
    };
    wrap(
        slot,
        &format!(
            "Not measured since {reason}; run `{}`{or_all}.",
            slot.command
        ),
    )
}

fn wrap(slot: Slot, inner: &str) -> String {
    format!(
        "{}\n## {}\n\n{}\n{}\n",
        begin_marker(slot.key),
        slot.title,
        inner.trim_end(),
        end_marker(slot.key)
    )
}

/// First line of a generated section; everything up to [`end_marker`] belongs to code.
pub fn begin_marker(key: &str) -> String {
    format!("<!-- generated: {key} — rewritten by `cargo xtask bench`; notes go outside -->")
}

pub fn end_marker(key: &str) -> String {
    format!("<!-- end generated: {key} -->")
}

/// A document whose markers cannot be trusted: writing would lose someone's text.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MarkerError {
    #[error("generated section {0:?} has a begin marker but no end marker after it")]
    Unclosed(String),
    #[error("generated section {0:?} appears more than once")]
    Duplicate(String),
    #[error("generated section {0:?} has an end marker without a begin marker")]
    Orphan(String),
}

/// Line range (begin marker ..= end marker) of `key`'s section, if present.
fn find(lines: &[&str], key: &str) -> Result<Option<(usize, usize)>, MarkerError> {
    let (begin, end) = (begin_marker(key), end_marker(key));
    let at = |m: &str| -> Vec<usize> {
        lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.trim_end() == m)
            .map(|(i, _)| i)
            .collect()
    };
    let (b, e) = (at(&begin), at(&end));
    if b.len() > 1 || e.len() > 1 {
        return Err(MarkerError::Duplicate(key.into()));
    }
    match (b.first(), e.first()) {
        (None, None) => Ok(None),
        (Some(&b), Some(&e)) if e > b => Ok(Some((b, e))),
        (Some(_), _) => Err(MarkerError::Unclosed(key.into())),
        (None, Some(_)) => Err(MarkerError::Orphan(key.into())),
    }
}

/// Replaces `key`'s generated section in `doc` with `rendered` (a [`Section::render`] or
/// [`not_measured`]), keeping every other byte; appends it when absent, after a title when
/// `doc` is empty.
pub fn replace_generated(doc: &str, key: &str, rendered: &str) -> Result<String, MarkerError> {
    let rendered = format!("{}\n", rendered.trim_end());
    let lines: Vec<&str> = doc.split_inclusive('\n').collect();
    let bare: Vec<&str> = lines.iter().map(|l| l.trim_end_matches('\n')).collect();
    Ok(match find(&bare, key)? {
        Some((b, e)) => {
            let mut out = lines[..b].concat();
            out.push_str(&rendered);
            out.push_str(&lines[e + 1..].concat());
            out
        }
        None if doc.trim().is_empty() => format!("# Benchmarks\n\n{rendered}"),
        None => format!("{}\n\n{rendered}", doc.trim_end()),
    })
}

/// One figure measured once per run, sorted. The median is nearest-rank (the lower of the
/// middle two for an even count) so that it is a value some run actually produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Runs(Vec<f64>);

impl Runs {
    /// Non-finite values (a failed division) are dropped rather than poisoning the sort.
    pub fn new(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        Self(v)
    }

    pub fn secs(values: &[Duration]) -> Self {
        Self::new(values.iter().map(Duration::as_secs_f64))
    }

    pub fn millis(values: &[Duration]) -> Self {
        Self::new(values.iter().map(|d| d.as_secs_f64() * 1000.0))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn median(&self) -> Option<f64> {
        percentile(&self.0, 50.0)
    }

    pub fn min(&self) -> Option<f64> {
        self.0.first().copied()
    }

    pub fn max(&self) -> Option<f64> {
        self.0.last().copied()
    }

    /// `25.0 s (20.0–30.0)`: the median with its unit, the range in the same unit;
    /// `n/a` without values.
    pub fn summary(&self, decimals: usize, unit: &str) -> String {
        match (self.median(), self.min(), self.max()) {
            (Some(m), Some(a), Some(b)) => {
                let unit = if unit.is_empty() {
                    String::new()
                } else {
                    format!(" {unit}")
                };
                format!("{m:.decimals$}{unit} ({a:.decimals$}–{b:.decimals$})")
            }
            _ => "n/a".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prov() -> Provenance {
        Provenance {
            command: "cargo xtask bench drain --vms 4 --runs 3".into(),
            commit: "abc1234".into(),
            date: "2026-12-02 10:24 UTC".into(),
            machine: "2 CPUs (X), 1.0 GiB RAM, Linux 6".into(),
        }
    }

    #[test]
    fn runs_median_and_range() {
        let r = Runs::new([30.0, 20.0, 25.0]);
        assert_eq!(r.summary(1, "s"), "25.0 s (20.0–30.0)");
        assert_eq!(r.len(), 3);
        // Even count: the lower middle value, one that was measured.
        assert_eq!(Runs::new([4.0, 1.0, 3.0, 2.0]).median(), Some(2.0));
        assert_eq!(Runs::new([7.0]).summary(0, "ms"), "7 ms (7–7)");
        assert_eq!(Runs::new([1.25, 2.5]).summary(2, ""), "1.25 (1.25–2.50)");
        assert_eq!(Runs::default().summary(1, "s"), "n/a");
        assert_eq!(Runs::new([f64::NAN, 1.0]).len(), 1);
        let d = [Duration::from_millis(1500), Duration::from_millis(500)];
        assert_eq!(Runs::secs(&d).summary(1, "s"), "0.5 s (0.5–1.5)");
        assert_eq!(Runs::millis(&d).summary(0, "ms"), "500 ms (500–1500)");
    }

    #[test]
    fn provenance_line_names_everything() {
        assert_eq!(
            prov().render(),
            "Command: `cargo xtask bench drain --vms 4 --runs 3` · commit abc1234 · \
             2026-12-02 10:24 UTC · machine: 2 CPUs (X), 1.0 GiB RAM, Linux 6"
        );
    }

    #[test]
    fn section_renders_markers_heading_provenance_body() {
        let s = Section::new(DRAIN, prov(), "\n| a |\n|---|\n| 1 |\n\n");
        assert_eq!(
            s.render(),
            format!(
                "{}\n## Node drain (cargo xtask bench drain)\n\n{}\n\n| a |\n|---|\n| 1 |\n{}\n",
                begin_marker("drain"),
                prov().render(),
                end_marker("drain")
            )
        );
        let p = not_measured(START, "issue 21");
        assert!(p.contains(
            "Not measured since issue 21; run `cargo xtask bench start` (or `cargo xtask bench all`)."
        ));
        assert!(p.starts_with(&begin_marker("start")));
        assert!(not_measured(ALL, "r").contains("; run `cargo xtask bench all`.\n"));
    }

    #[test]
    fn slots_are_unique() {
        for (i, a) in SLOTS.iter().enumerate() {
            for b in &SLOTS[i + 1..] {
                assert_ne!(a.key, b.key);
                assert_ne!(a.title, b.title);
            }
        }
    }

    #[test]
    fn the_checked_in_document_has_every_section_once() {
        let doc = include_str!("../../../../docs/benchmarks.md");
        let lines: Vec<&str> = doc.lines().collect();
        for slot in SLOTS {
            let found = find(&lines, slot.key);
            assert!(matches!(found, Ok(Some(_))), "{}: {found:?}", slot.key);
        }
    }

    const NOTES: &str = "## Notes (hand-written)\n\nkeep *me*\n";

    #[test]
    fn replacing_keeps_hand_written_sections_byte_for_byte() {
        let old = Section::new(MIGRATE, prov(), "old figures").render();
        let other = Section::new(DRAIN, prov(), "drain figures").render();
        let doc = format!("# Benchmarks\n\nintro\n\n{old}\n{NOTES}\n{other}\n## Tail\nt\n");
        let new = Section::new(MIGRATE, prov(), "new figures").render();
        let out = replace_generated(&doc, "migrate", &new).unwrap();
        assert_eq!(
            out,
            format!("# Benchmarks\n\nintro\n\n{new}\n{NOTES}\n{other}\n## Tail\nt\n")
        );
        // Idempotent, and the other generated section is untouched.
        assert_eq!(replace_generated(&out, "migrate", &new).unwrap(), out);
    }

    #[test]
    fn absent_sections_are_appended() {
        let s = Section::new(DRAIN, prov(), "x").render();
        assert_eq!(
            replace_generated("", "drain", &s).unwrap(),
            format!("# Benchmarks\n\n{s}")
        );
        assert_eq!(
            replace_generated(NOTES, "drain", &s).unwrap(),
            format!("{NOTES}\n{s}")
        );
    }

    #[test]
    fn broken_markers_refuse_to_write() {
        let b = begin_marker("drain");
        let e = end_marker("drain");
        assert_eq!(
            replace_generated(&format!("{b}\nx\n"), "drain", "y"),
            Err(MarkerError::Unclosed("drain".into()))
        );
        assert_eq!(
            replace_generated(&format!("{e}\n{b}\n"), "drain", "y"),
            Err(MarkerError::Unclosed("drain".into()))
        );
        assert_eq!(
            replace_generated(&format!("{b}\n{e}\n{b}\n{e}\n"), "drain", "y"),
            Err(MarkerError::Duplicate("drain".into()))
        );
        assert_eq!(
            replace_generated(&format!("x\n{e}\n"), "drain", "y"),
            Err(MarkerError::Orphan("drain".into()))
        );
        // A key that is a prefix of another is a different section.
        let crd = not_measured(CRD, "r");
        let doc = replace_generated("", "apiserver-vs-crd", &crd).unwrap();
        let api = not_measured(APISERVER, "r");
        let out = replace_generated(&doc, "apiserver", &api).unwrap();
        assert!(out.contains(&crd) && out.ends_with(&api), "{out}");
    }
}
