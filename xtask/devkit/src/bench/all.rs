//! `cargo xtask bench all`: every benchmark in one command, each writing its own section,
//! so docs/benchmarks.md is regenerated as a whole from one commit on one machine. Its own
//! section records what ran, how long each took and what failed.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

use super::section::{self, Provenance, Section};

/// Arguments of `cargo xtask bench all`.
#[derive(clap::Args, Debug, Clone)]
pub struct AllArgs {
    /// Runs of every benchmark that repeats (both sides of a comparison alternate).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Benchmarks to leave out (apiserver, abuse, apiserver-vs-crd, scale, pool, launcher, network, migrate,
    /// storage, port-forward, start, drain), e.g. `start,drain`; their sections keep what they hold.
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
}

/// One benchmark of the plan: the arguments after `cargo xtask bench`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub name: &'static str,
    /// The section it writes.
    pub slot: section::Slot,
    pub argv: Vec<String>,
    /// Needs the local cluster with kubevirt-rs deployed.
    pub cluster: bool,
}

/// The benchmarks in the order they run: those without a cluster first, the longest
/// (start, drain) last so a failure there costs the least.
pub fn plan(args: &AllArgs) -> Vec<Step> {
    let runs = args.runs.max(1).to_string();
    let step = |slot: section::Slot, cluster: bool, extra: &[&str]| Step {
        name: slot.key,
        slot,
        argv: std::iter::once(subcommand(slot))
            .chain(extra.iter().copied())
            .map(str::to_string)
            .collect(),
        cluster,
    };
    [
        step(section::APISERVER, false, &[]),
        step(section::ABUSE, false, &[]),
        step(section::CRD, false, &["--runs", &runs]),
        step(section::SCALE, false, &["--runs", &runs]),
        step(section::POOL, false, &["--runs", &runs]),
        step(section::LAUNCHER, false, &["--runs", &runs]),
        step(section::NETWORK, false, &["--runs", &runs]),
        step(section::MIGRATE, true, &["--runs", &runs]),
        step(section::STORAGE, true, &["--runs", &runs]),
        step(section::PORT_FORWARD, true, &["--runs", &runs]),
        step(section::START, true, &[]),
        step(
            section::START_DEBIAN,
            true,
            &["--guest", "debian", "--runs", &runs],
        ),
        step(section::DRAIN, true, &["--runs", &runs]),
        step(section::ETCD_DRAIN, true, &["--runs", &runs]),
        step(section::INSTANCETYPE, true, &["--runs", &runs]),
        step(section::SCRAPE, true, &[]),
        step(section::HOTPLUG, true, &["--runs", &runs]),
    ]
    .into_iter()
    .filter(|s| !args.skip.iter().any(|k| k == s.name))
    .collect()
}

/// The `cargo xtask bench` subcommand that writes `slot`, from the command its
/// placeholder names: a section's key is its marker's and need not be the subcommand's.
fn subcommand(slot: section::Slot) -> &'static str {
    slot.command
        .strip_prefix("cargo xtask bench ")
        .and_then(|c| c.split_whitespace().next())
        .unwrap_or(slot.key)
}

/// How one step ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub step: Step,
    pub took: Duration,
    /// The error, on one line, when it failed.
    pub error: Option<String>,
}

/// The command `bench all` was given, every option spelt out.
pub fn command(args: &AllArgs) -> String {
    let mut c = format!("cargo xtask bench all --runs {}", args.runs.max(1));
    if !args.skip.is_empty() {
        c.push_str(&format!(" --skip {}", args.skip.join(",")));
    }
    c
}

fn minutes(d: Duration) -> String {
    format!("{:.1} min", d.as_secs_f64() / 60.0)
}

/// The run's record: a row per step, then the total.
pub fn body(outcomes: &[Outcome], total: Duration, skipped: &[String]) -> String {
    let mut s = String::from(
        "Each benchmark below wrote its own section during this run; a failed one's section \
         says so instead of keeping figures from another commit.\n\n| benchmark | command | took | result |\n|---|---|---|---|\n",
    );
    for o in outcomes {
        s.push_str(&format!(
            "| {} | `cargo xtask bench {}` | {} | {} |\n",
            o.step.name,
            o.step.argv.join(" "),
            minutes(o.took),
            o.error.as_deref().map_or("written".into(), |e| format!(
                "failed: {}",
                e.replace('|', "\\|")
            )),
        ));
    }
    s.push_str(&format!("\nWhole run: {}.", minutes(total)));
    if !skipped.is_empty() {
        s.push_str(&format!(" Skipped: {}.", skipped.join(", ")));
    }
    s.push('\n');
    s
}

/// `bench all`'s parser for one step's arguments, so each step runs exactly as its
/// recorded command would.
#[derive(Parser, Debug)]
#[command(no_binary_name = true)]
struct One {
    #[command(subcommand)]
    bench: super::Bench,
}

fn run_step(step: &Step) -> anyhow::Result<()> {
    let one = One::try_parse_from(&step.argv)
        .with_context(|| format!("parsing `{}`", step.argv.join(" ")))?;
    super::run(super::Args { bench: one.bench })
}

/// Runs the plan; fails at the end when any step failed.
pub fn run(args: AllArgs) -> anyhow::Result<()> {
    if cfg!(debug_assertions) {
        // The API benchmarks need an optimised client; one release process for all of
        // them keeps the steps from re-executing themselves one by one.
        return super::apiserver::rerun_release();
    }
    let steps = plan(&args);
    if steps.iter().any(|s| s.cluster) {
        let kubeconfig = crate::target_dir().join("cluster/kubeconfig");
        anyhow::ensure!(
            kubeconfig.exists(),
            "the cluster benchmarks need the two-node local cluster with kubevirt-rs: \
             `cargo xtask cluster up --nodes 2 && cargo xtask up` (or --skip them)"
        );
    }
    let provenance = Provenance::probe(command(&args));
    let t0 = Instant::now();
    let mut outcomes = Vec::new();
    for step in steps {
        eprintln!("==> cargo xtask bench {}", step.argv.join(" "));
        let started = Instant::now();
        let result = run_step(&step);
        let error = result.err().map(|e| format!("{e:#}").replace('\n', " "));
        if let Some(e) = &error {
            eprintln!("==> {} failed: {e}", step.name);
            // A document regenerated as a whole holds one commit's figures: older ones
            // stay in git history, not beside this run's.
            let reason = format!(
                "`{}` at commit {} failed on {}: {e}",
                provenance.command, provenance.commit, provenance.date
            );
            super::write_generated(step.slot.key, &section::not_measured(step.slot, &reason))?;
        }
        outcomes.push(Outcome {
            step,
            took: started.elapsed(),
            error,
        });
    }
    let body = body(&outcomes, t0.elapsed(), &args.skip);
    print!("{body}");
    super::record(&Section::new(section::ALL, provenance, body), false)?;
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.error.is_some())
        .map(|o| o.step.name)
        .collect();
    anyhow::ensure!(failed.is_empty(), "failed: {}", failed.join(", "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(skip: &[&str]) -> AllArgs {
        AllArgs {
            runs: 3,
            skip: skip.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn plan_covers_every_section_but_its_own() {
        let names: Vec<&str> = plan(&args(&[])).iter().map(|s| s.name).collect();
        let keys: Vec<&str> = section::SLOTS
            .iter()
            .map(|s| s.key)
            .filter(|k| *k != "all")
            .collect();
        assert_eq!(names.len(), keys.len());
        for k in keys {
            assert!(names.contains(&k), "{k} not in the plan");
        }
    }

    #[test]
    fn every_step_parses_as_its_subcommand() {
        for s in plan(&args(&[])) {
            let one = One::try_parse_from(&s.argv).unwrap_or_else(|e| panic!("{s:?}: {e}"));
            let crd = matches!(one.bench, crate::bench::Bench::Crd(_));
            assert_eq!(crd, s.name == "apiserver-vs-crd", "{s:?}");
        }
    }

    #[test]
    fn skip_and_runs_are_honoured() {
        let crd = plan(&args(&[]))
            .into_iter()
            .find(|s| s.name == "apiserver-vs-crd")
            .unwrap();
        // Its own harness, no cluster.
        assert_eq!(crd.argv, ["crd", "--runs", "3"]);
        assert!(!crd.cluster);
        let p = plan(&args(&["start", "apiserver-vs-crd"]));
        assert!(p.iter().all(|s| s.name != "start"));
        assert!(p.iter().all(|s| s.argv[0] != "crd"));
        let drain = p.iter().find(|s| s.name == "drain").unwrap();
        assert_eq!(drain.argv, ["drain", "--runs", "3"]);
        assert_eq!(
            command(&args(&["start"])),
            "cargo xtask bench all --runs 3 --skip start"
        );
    }

    #[test]
    fn body_lists_steps_times_and_failures() {
        let p = plan(&args(&[]));
        let o = vec![
            Outcome {
                step: p[0].clone(),
                took: Duration::from_secs(90),
                error: None,
            },
            Outcome {
                step: p[1].clone(),
                took: Duration::from_secs(30),
                error: Some("no | qemu".into()),
            },
        ];
        let b = body(&o, Duration::from_secs(120), &["start".into()]);
        assert!(
            b.contains("| apiserver | `cargo xtask bench apiserver` | 1.5 min | written |"),
            "{b}"
        );
        assert!(b.contains("| 0.5 min | failed: no \\| qemu |"), "{b}");
        assert!(b.ends_with("Whole run: 2.0 min. Skipped: start.\n"), "{b}");
    }
}
