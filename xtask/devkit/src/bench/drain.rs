//! `cargo xtask bench drain`: `kubectl drain` of a node holding N idle VMs
//! (`evictionStrategy: LiveMigrate`, the test guest under TCG) on the two-node local cluster,
//! against one migration of one of those VMs measured in the same run.
//!
//! Each run: every VM on node X; one VM migrated X → Y and back (two single-migration
//! samples, VMIM created → `Succeeded`); then `kubectl drain X` (launcher pods only, so
//! that the figure is the VMs' evacuation, not the control plane's) timed from start to exit,
//! every VM then checked on Y with the same VMI (no restart); X uncordoned and the roles
//! swapped for the next run. The goal (issue 19): drain ≤ 2 × ⌈N / parallel limit⌉ × one
//! migration + 10 s, where the limit is 2 outbound migrations per node.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::section::{self, Provenance, Runs};
use crate::deploy::Kubectl as Kube;

/// KubeVirt's default parallelOutboundMigrationsPerNode, which virt-controller enforces.
const OUTBOUND_LIMIT: usize = 2;

/// Arguments of `cargo xtask bench drain`.
#[derive(clap::Args, Debug, Clone)]
pub struct DrainArgs {
    /// VMs on the drained node, one table row per count (e.g. `4,10`).
    #[arg(long, value_delimiter = ',', default_values_t = [4, 10])]
    pub vms: Vec<usize>,
    /// Drains (the VMs go back and forth between the two nodes).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Kubeconfig of the cluster (default: $KUBECONFIG, then the local cluster's).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
}

/// The figures of the whole benchmark.
#[derive(Debug, Default)]
pub struct Figures {
    pub vms: usize,
    /// `kubectl drain` start → exit, per run.
    pub drains: Vec<Duration>,
    /// One migration, VMIM created → `Succeeded`, two per run.
    pub singles: Vec<Duration>,
    /// VMs that did not come through a drain as the same running VMI.
    pub restarts: usize,
}

/// The goal for `vms` VMs given one migration's median.
pub fn goal(vms: usize, single: Duration) -> Duration {
    let waves = u32::try_from(vms.div_ceil(OUTBOUND_LIMIT)).unwrap_or(u32::MAX);
    single.saturating_mul(2 * waves) + Duration::from_secs(10)
}

/// The figures as a markdown table, a row per VM count.
pub fn table(all: &[Figures]) -> String {
    let mut out = format!(
        "| VMs | drain (median, min–max) | one migration (median, min–max) | goal: 2 × ⌈N/{OUTBOUND_LIMIT}⌉ × one + 10 s | met | restarted VMs |\n\
         |---|---|---|---|---|---|\n"
    );
    for f in all {
        let (drains, singles) = (Runs::secs(&f.drains), Runs::secs(&f.singles));
        let single = Duration::from_secs_f64(singles.median().unwrap_or_default());
        let goal = goal(f.vms, single);
        let met = drains.median().is_some_and(|d| d <= goal.as_secs_f64());
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} s | {} | {} |\n",
            f.vms,
            drains.summary(1, "s"),
            singles.summary(1, "s"),
            goal.as_secs_f64(),
            if met { "yes" } else { "no" },
            f.restarts,
        ));
    }
    out
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// name → (uid, phase, node) of every VMI in `ns`.
fn vmis(kube: &Kube, ns: &str) -> anyhow::Result<Vec<(String, String, String, String)>> {
    let list = kube
        .json(&["-n", ns, "get", "vmi"])?
        .context("listing VMIs")?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            let s = |p: &str| {
                v.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            (
                s("/metadata/name"),
                s("/metadata/uid"),
                s("/status/phase"),
                s("/status/nodeName"),
            )
        })
        .collect())
}

fn migrate_once(kube: &Kube, ns: &str, vm: &str, n: usize) -> anyhow::Result<Duration> {
    super::migrate::migrate_and_wait(kube, ns, vm, &format!("single-{n}")).map(|(t, _)| t)
}

fn vm_manifest(name: &str, ns: &str) -> anyhow::Result<String> {
    let mut vm: Value = serde_json::from_str(&super::test_guest_vm(name, ns))?;
    vm["spec"]["template"]["spec"]["evictionStrategy"] = json!("LiveMigrate");
    Ok(vm.to_string())
}

fn measure(
    kube: &Kube,
    ns: &str,
    vms: usize,
    args: &DrainArgs,
    nodes: &[String],
) -> anyhow::Result<Figures> {
    let names: Vec<String> = (0..vms).map(|i| format!("d{i}")).collect();
    let (mut x, mut y) = (nodes[0].clone(), nodes[1].clone());
    // Every VM starts on X.
    kube.run(&["cordon", &y], None)?;
    for n in &names {
        kube.run(&["apply", "-f", "-"], Some(&vm_manifest(n, ns)?))?;
    }
    wait_for("every VM running", Duration::from_secs(600), || {
        vmis(kube, ns)
            .is_ok_and(|v| v.len() == names.len() && v.iter().all(|(_, _, p, _)| p == "Running"))
    })?;
    kube.run(&["uncordon", &y], None)?;
    // Booted and idle (the banner comes ~2 s after Running under TCG).
    std::thread::sleep(Duration::from_secs(10));
    let mut f = Figures {
        vms: names.len(),
        ..Figures::default()
    };
    for run in 0..args.runs {
        f.singles.push(migrate_once(kube, ns, &names[0], 2 * run)?);
        std::thread::sleep(Duration::from_secs(3));
        f.singles
            .push(migrate_once(kube, ns, &names[0], 2 * run + 1)?);
        std::thread::sleep(Duration::from_secs(3));
        let before = vmis(kube, ns)?;
        if let Some((n, ..)) = before.iter().find(|(_, _, _, node)| *node != x) {
            bail!("VM {n} is not on {x} before the drain");
        }
        let t0 = Instant::now();
        let out = kube.run(
            &[
                "drain",
                &x,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--pod-selector=kubevirt.io=virt-launcher",
                "--timeout=900s",
            ],
            None,
        );
        let took = t0.elapsed();
        kube.run(&["uncordon", &x], None)?;
        out.with_context(|| format!("kubectl drain {x}"))?;
        f.drains.push(took);
        let after = vmis(kube, ns)?;
        let restarted = before
            .iter()
            .filter(|(n, uid, ..)| {
                !after.iter().any(|(an, auid, p, node)| {
                    an == n && auid == uid && p == "Running" && *node == y
                })
            })
            .count();
        f.restarts += restarted;
        eprintln!(
            "run {run}: drain of {x} with {} VMs {:.1} s, one migration {:.1} s / {:.1} s, {restarted} restarted",
            names.len(),
            took.as_secs_f64(),
            f.singles[2 * run].as_secs_f64(),
            f.singles[2 * run + 1].as_secs_f64()
        );
        // The old pods go with their grace period; let the nodes settle.
        std::thread::sleep(Duration::from_secs(5));
        std::mem::swap(&mut x, &mut y);
    }
    Ok(f)
}

/// Runs the benchmark.
pub fn run(args: DrainArgs) -> anyhow::Result<()> {
    // Taken before the run: the figures belong to the code and machine at its start.
    let provenance = Provenance::probe(args.command());

    let kubeconfig = args
        .kubeconfig
        .clone()
        .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from))
        .unwrap_or_else(|| crate::target_dir().join("cluster/kubeconfig"));
    let kube = Kube::new(kubeconfig);
    let nodes: Vec<String> = kube
        .run(
            &["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"],
            None,
        )?
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if nodes.len() < 2 {
        bail!("a drain needs two nodes: cargo xtask cluster up --nodes 2 && cargo xtask up");
    }
    let mut figures = Vec::new();
    for &vms in &args.vms {
        let ns = format!("bench-drain-{}-{vms}", std::process::id());
        kube.run(&["create", "namespace", &ns], None)?;
        let result = measure(&kube, &ns, vms.max(1), &args, &nodes);
        for n in &nodes {
            let _ = kube.run(&["uncordon", n], None);
        }
        // Gone before the next count starts: its VMs would share the nodes.
        let _ = kube.run(&["delete", "namespace", &ns, "--timeout=300s"], None);
        figures.push(result?);
    }
    let table = table(&figures);
    print!("{table}");
    super::record_table(
        section::DRAIN,
        provenance,
        DESCRIPTION,
        &table,
        args.no_docs,
    )
}

/// What the table measures; the same for every run.
const DESCRIPTION: &str = "N idle test guests (busybox initramfs, 256 MiB, TCG, \
    `evictionStrategy: LiveMigrate`) on one node of the local cluster; each run first migrates one \
    of them there and back (VMIM created → `Succeeded`, two samples per run), then times \
    `kubectl drain NODE --ignore-daemonsets --delete-emptydir-data \
    --pod-selector=kubevirt.io=virt-launcher` from start to exit (drain retries each refused \
    eviction every 5 s), checks every VM runs on the other node as the same VMI, uncordons, and \
    the next run drains the other way. Limits: parallelOutboundMigrationsPerNode 2, \
    parallelMigrationsPerCluster 5. Median and min–max over the runs.";

impl DrainArgs {
    /// The command that reproduces this run, every option spelt out.
    pub fn command(&self) -> String {
        let vms: Vec<String> = self.vms.iter().map(ToString::to_string).collect();
        format!(
            "cargo xtask bench drain --vms {} --runs {}",
            vms.join(","),
            self.runs
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goal_counts_waves_of_two() {
        let one = Duration::from_secs(8);
        assert_eq!(goal(4, one), Duration::from_secs(2 * 2 * 8 + 10));
        assert_eq!(goal(5, one), Duration::from_secs(2 * 3 * 8 + 10));
        assert_eq!(goal(1, one), Duration::from_secs(2 * 8 + 10));
    }

    #[test]
    fn command_spells_out_the_options() {
        let a = DrainArgs {
            vms: vec![4, 16],
            runs: 3,
            kubeconfig: None,
            no_docs: false,
        };
        assert_eq!(a.command(), "cargo xtask bench drain --vms 4,16 --runs 3");
    }

    #[test]
    fn table_reports_medians_and_the_goal() {
        let s = Duration::from_secs;
        let f = Figures {
            vms: 4,
            drains: vec![s(30), s(20), s(25)],
            singles: vec![s(8), s(9), s(7), s(8), s(8), s(10)],
            restarts: 0,
        };
        let t = table(&[f]);
        assert!(
            t.contains("| 4 | 25.0 s (20.0–30.0) | 8.0 s (7.0–10.0) | 42.0 s | yes | 0 |"),
            "{t}"
        );
    }
}
