//! `cargo xtask bench scrape`: what a Prometheus scrape of virt-handler costs with N running
//! VMs on its node (issue 42 point 5; goal: a scrape of 20 VMs under 100 ms), and the memory
//! virt-handler holds per VM.
//!
//! On the local cluster: virt-handler's `/metrics` on the first node is scraped over plain
//! HTTP from this machine (its pod IP, as Prometheus does) with no VMs of the benchmark, then
//! N VMs of the test guest are started on that node and it is scraped again. Each scrape
//! reads every running VM's libvirt statistics through its launcher (`domainstats`): that is
//! what is timed. virt-handler's resident memory is read from `/proc` before and after (each
//! settled), and its growth divided by N. Then one VM is deleted and the first scrape after
//! its VMI is gone is checked for its series.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::section::{self, Provenance, Runs, Section};
use crate::deploy::Kubectl as Kube;

/// Arguments of `cargo xtask bench scrape`.
#[derive(clap::Args, Debug, Clone)]
pub struct ScrapeArgs {
    /// Running VMs on the scraped node.
    #[arg(long, default_value_t = 20)]
    pub vms: usize,
    /// Scrapes timed in each state (after one unmeasured).
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Kubeconfig of the cluster (default: $KUBECONFIG, then the local cluster's).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
}

impl ScrapeArgs {
    /// The command that reproduces this run, every option spelt out.
    pub fn command(&self) -> String {
        format!(
            "cargo xtask bench scrape --vms {} --runs {}",
            self.vms, self.runs
        )
    }
}

/// The goal of issue 42: one scrape of 20 VMs.
const GOAL: Duration = Duration::from_millis(100);

/// The test guest on `node`, 128 MiB (N of them share the node).
fn vm(name: &str, ns: &str, node: &str) -> Value {
    let mut vm: Value =
        serde_json::from_str(&super::test_guest_vm(name, ns)).unwrap_or_else(|_| json!({}));
    let spec = &mut vm["spec"]["template"]["spec"];
    spec["domain"]["memory"]["guest"] = json!("128Mi");
    // KubeVirt's default request (100m) would fit 15 VMs on 2 CPUs; idle busybox guests
    // need little (bench start's density VMs ask the same).
    spec["domain"]["resources"] = json!({"requests": {"cpu": "10m"}});
    spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    vm
}

/// Series of a VMI named `name` in a scrape (its `name` label).
fn series_of(text: &str, ns: &str, name: &str) -> usize {
    let (n, v) = (format!("name=\"{name}\""), format!("namespace=\"{ns}\""));
    text.lines()
        .filter(|l| l.starts_with("kubevirt_vmi_") && l.contains(&n) && l.contains(&v))
        .count()
}

/// One timed scrape.
#[derive(Debug, Clone)]
struct Scrape {
    took: Duration,
    text: String,
}

fn scrape(
    rt: &tokio::runtime::Runtime,
    http: &reqwest::Client,
    url: &str,
) -> anyhow::Result<Scrape> {
    rt.block_on(async {
        let t = Instant::now();
        let r = http.get(url).send().await?.error_for_status()?;
        let text = r.text().await?;
        Ok(Scrape {
            took: t.elapsed(),
            text,
        })
    })
}

/// `runs` scrapes after one unmeasured: their times and the last body.
fn scrapes(
    rt: &tokio::runtime::Runtime,
    http: &reqwest::Client,
    url: &str,
    runs: usize,
) -> anyhow::Result<(Vec<Duration>, String)> {
    scrape(rt, http, url)?;
    let mut times = Vec::new();
    let mut last = String::new();
    for _ in 0..runs.max(1) {
        // Prometheus' own pace would be seconds apart; a little rest keeps one scrape's
        // work out of the next one's time.
        std::thread::sleep(Duration::from_millis(300));
        let s = scrape(rt, http, url)?;
        times.push(s.took);
        last = s.text;
    }
    Ok((times, last))
}

/// virt-handler's PID on this machine: the process named so whose environment has the
/// pod's IP (the downward API's `POD_IP`).
fn handler_pid(pod_ip: &str) -> Option<u32> {
    let want = format!("POD_IP={pod_ip}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        if comm.trim() != "virt-handler" {
            return None;
        }
        let env = std::fs::read(e.path().join("environ")).ok()?;
        env.split(|b| *b == 0)
            .any(|kv| kv == want.as_bytes())
            .then_some(pid)
    })
}

/// Resident memory in KiB once it stopped moving (5 readings a second apart within 2 %), or
/// the median of the last 5 after 60 s.
fn settled_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let start = Instant::now();
    let mut window: Vec<u64> = Vec::new();
    loop {
        let kib = super::apiserver::status_kib(pid, "VmRSS")
            .with_context(|| format!("no VmRSS for virt-handler (pid {pid})"))?;
        window.push(kib);
        if window.len() > 5 {
            window.remove(0);
        }
        if window.len() == 5 {
            let (lo, hi) = (
                *window.iter().min().unwrap_or(&0),
                *window.iter().max().unwrap_or(&0),
            );
            if hi as f64 <= lo as f64 * 1.02 || start.elapsed() > Duration::from_secs(60) {
                let mut w = window.clone();
                w.sort_unstable();
                return Ok(w[2]);
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The figures.
#[derive(Debug, Clone)]
pub struct Figures {
    pub vms: usize,
    pub idle: Vec<Duration>,
    pub loaded: Vec<Duration>,
    pub idle_bytes: usize,
    pub loaded_bytes: usize,
    pub series_per_vm: usize,
    pub rss_per_vm_bytes: f64,
    /// Whether the first scrape after a deleted VM's VMI was gone had none of its series.
    pub deleted_gone: bool,
}

/// The figures as a markdown table, against the goal.
pub fn table(f: &Figures) -> String {
    let (idle, loaded) = (Runs::millis(&f.idle), Runs::millis(&f.loaded));
    let met = match loaded.median() {
        Some(ms) if f.vms >= 20 && ms < GOAL.as_secs_f64() * 1000.0 => "met",
        Some(_) if f.vms < 20 => "n/a (fewer than 20 VMs)",
        Some(_) => "not met",
        None => "n/a",
    };
    format!(
        "| figure | value |\n|---|---|\n\
         | one scrape, no VM of the benchmark on the node, median (min–max) of {} | {} |\n\
         | one scrape, {} VMs running on the node, median (min–max) of {} | {} |\n\
         | body, no VM / {} VMs | {:.1} KiB / {:.1} KiB |\n\
         | `kubevirt_vmi_*` series per VM | {} |\n\
         | virt-handler resident memory per VM | {:.0} KiB |\n\
         | a deleted VM's series gone by the first scrape after its VMI | {} |\n\
         | goal: {} VMs in < {} ms | {met} |\n",
        f.idle.len(),
        idle.summary(1, "ms"),
        f.vms,
        f.loaded.len(),
        loaded.summary(1, "ms"),
        f.vms,
        f.idle_bytes as f64 / 1024.0,
        f.loaded_bytes as f64 / 1024.0,
        f.series_per_vm,
        f.rss_per_vm_bytes / 1024.0,
        if f.deleted_gone { "yes" } else { "no" },
        20,
        GOAL.as_millis(),
    )
}

const DESCRIPTION: &str = "virt-handler's `/metrics` on the first node of the local \
    cluster, scraped over plain HTTP from this machine at its pod IP (as Prometheus does), \
    with no VM of the benchmark on the node and then with N VMs of the test guest (busybox \
    initramfs, TCG, 128 MiB, 10m CPU requested) running there. Each scrape reads every running VM's libvirt \
    statistics through its launcher, with a bounded wait per VM. virt-handler's resident \
    memory is read from /proc, settled, before the VMs and after, and its growth divided by \
    N: everything virt-handler keeps per VM (its follower, status, the collector), not the \
    collector alone.";

pub fn run(args: ScrapeArgs) -> anyhow::Result<()> {
    let provenance = Provenance::probe(args.command());
    let kube = Kube::new(crate::deploy::kubeconfig(args.kubeconfig.clone()));
    let node = kube
        .run(
            &["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"],
            None,
        )
        .context("no cluster (cargo xtask up)")?
        .trim()
        .to_string();
    let handler = kube.run(
        &[
            "get",
            "pods",
            "-n",
            "kubevirt",
            "-l",
            "kubevirt.io=virt-handler",
            "--field-selector",
            &format!("spec.nodeName={node}"),
            "-o",
            "jsonpath={.items[0].metadata.name} {.items[0].status.podIP} \
             {.items[0].spec.containers[0].image}",
        ],
        None,
    )?;
    let mut parts = handler.split_whitespace();
    let (Some(pod), Some(ip), Some(image)) = (parts.next(), parts.next(), parts.next()) else {
        bail!("no virt-handler on node {node} (is kubevirt-rs deployed? cargo xtask up)");
    };
    let url = format!("http://{ip}:8187/metrics");
    let pid =
        handler_pid(ip).with_context(|| format!("virt-handler {pod} is not on this machine"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;

    let ns = format!("bench-scrape-{}", std::process::id());
    let (idle, idle_text) = scrapes(&rt, &http, &url, args.runs)?;
    let rss_before = settled_rss_kib(pid)?;
    kube.run(&["create", "namespace", &ns], None)?;
    let result = (|| -> anyhow::Result<Figures> {
        let names: Vec<String> = (0..args.vms).map(|i| format!("vm-{i}")).collect();
        let list = json!({"apiVersion": "v1", "kind": "List",
            "items": names.iter().map(|n| vm(n, &ns, &node)).collect::<Vec<_>>()});
        kube.run(&["apply", "-f", "-"], Some(&list.to_string()))?;
        let t = Instant::now();
        loop {
            let phases = kube.run(
                &[
                    "get",
                    "vmi",
                    "-n",
                    &ns,
                    "-o",
                    "jsonpath={.items[*].status.phase}",
                ],
                None,
            )?;
            let running = phases
                .split_whitespace()
                .filter(|p| *p == "Running")
                .count();
            if running == args.vms {
                break;
            }
            if t.elapsed() > Duration::from_secs(600) {
                bail!("{running} of {} VMs Running after 600 s", args.vms);
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        eprintln!("{} VMs Running after {:.0?}", args.vms, t.elapsed());
        // Every VM in the scrape before timing it.
        let t = Instant::now();
        loop {
            let s = scrape(&rt, &http, &url)?;
            if names.iter().all(|n| series_of(&s.text, &ns, n) > 0) {
                break;
            }
            if t.elapsed() > Duration::from_secs(120) {
                bail!("not every VM in virt-handler's scrape after 120 s");
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        let (loaded, loaded_text) = scrapes(&rt, &http, &url, args.runs)?;
        let rss_after = settled_rss_kib(pid)?;
        let series_per_vm = series_of(&loaded_text, &ns, &names[0]);

        let gone = &names[0];
        kube.run(&["delete", "vm", "-n", &ns, gone, "--wait=false"], None)?;
        let t = Instant::now();
        while !kube
            .run(
                &[
                    "get",
                    "vmi",
                    "-n",
                    &ns,
                    gone,
                    "--ignore-not-found",
                    "-o",
                    "name",
                ],
                None,
            )?
            .trim()
            .is_empty()
        {
            if t.elapsed() > Duration::from_secs(120) {
                bail!("VMI {gone} not gone after 120 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let deleted_gone = series_of(&scrape(&rt, &http, &url)?.text, &ns, gone) == 0;
        Ok(Figures {
            vms: args.vms,
            idle,
            loaded,
            idle_bytes: idle_text.len(),
            loaded_bytes: loaded_text.len(),
            series_per_vm,
            rss_per_vm_bytes: (rss_after as f64 - rss_before as f64) * 1024.0
                / args.vms.max(1) as f64,
            deleted_gone,
        })
    })();
    let _ = kube.run(&["delete", "namespace", &ns, "--wait=false"], None);
    let figures = result?;
    let table = table(&figures);
    print!("{table}");
    let section = Section::new(
        section::SCRAPE,
        provenance,
        format!(
            "{DESCRIPTION} Deployed: `{image}`{}.\n\n{table}",
            if image.contains(":dev-") {
                " (debug build)"
            } else {
                ""
            }
        ),
    );
    super::record(&section, args.no_docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vms_are_pinned_to_the_scraped_node() {
        let v = vm("vm-0", "ns", "node-a");
        assert_eq!(
            v["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"],
            "node-a"
        );
        assert_eq!(
            v["spec"]["template"]["spec"]["domain"]["memory"]["guest"],
            "128Mi"
        );
    }

    #[test]
    fn series_are_counted_by_namespace_and_name() {
        let text = "kubevirt_vmi_memory_resident_bytes{node=\"n\",namespace=\"ns\",name=\"vm-1\"} 1\n\
                    kubevirt_vmi_memory_resident_bytes{node=\"n\",namespace=\"ns\",name=\"vm-10\"} 1\n\
                    kubevirt_vmi_memory_resident_bytes{node=\"n\",namespace=\"other\",name=\"vm-1\"} 1\n";
        assert_eq!(series_of(text, "ns", "vm-1"), 1);
        assert_eq!(series_of(text, "ns", "vm-2"), 0);
    }

    #[test]
    fn the_table_judges_the_median_of_20_vms() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|m| Duration::from_millis(*m))
                .collect::<Vec<_>>()
        };
        let f = Figures {
            vms: 20,
            idle: ms(&[2, 3, 4]),
            loaded: ms(&[40, 50, 200]),
            idle_bytes: 2048,
            loaded_bytes: 204_800,
            series_per_vm: 60,
            rss_per_vm_bytes: 30.0 * 1024.0,
            deleted_gone: true,
        };
        let t = table(&f);
        assert!(t.contains("| goal: 20 VMs in < 100 ms | met |"), "{t}");
        assert!(t.contains("| 30 KiB |"), "{t}");
        let t = table(&Figures {
            loaded: ms(&[150, 160, 170]),
            ..f
        });
        assert!(t.contains("not met"), "{t}");
    }
}
