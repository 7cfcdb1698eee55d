//! `cargo xtask bench port-forward`: what `kubectl virt port-forward` costs against a
//! direct TCP connection to the VMI's pod IP, both sides in one run, alternating: a
//! large HTTP download from the guest (throughput) and small requests (round trip).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::section::{self, Provenance, Runs};
use crate::deploy::Kubectl as Kube;

const VM: &str = "pf";

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct PortForwardArgs {
    /// Downloads per path (direct and port-forward alternate).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Small requests per path and run.
    #[arg(long, default_value_t = 20)]
    pub requests: usize,
    /// Kubeconfig of the cluster (default: $KUBECONFIG, then the local cluster's).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
}

/// `GET path` over HTTP/1.0: how long until the server closed, and the bytes received.
fn get(addr: &str, path: &str) -> anyhow::Result<(Duration, u64)> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut n = 0u64;
    loop {
        match s.read(&mut buf)? {
            0 => break,
            k => n += k as u64,
        }
    }
    Ok((t0.elapsed(), n))
}

/// Figures of one path.
#[derive(Debug, Default)]
struct PathFigures {
    /// MiB/s of each download.
    throughput: Vec<f64>,
    /// Milliseconds of each small request.
    round_trip: Vec<f64>,
}

fn measure(addr: &str, requests: usize, f: &mut PathFigures) -> anyhow::Result<()> {
    let (t, n) = get(addr, "/zeros")?;
    if n < virt_testguest::ZEROS_BYTES {
        bail!("only {n} bytes of /zeros through {addr}");
    }
    f.throughput
        .push(n as f64 / (1024.0 * 1024.0) / t.as_secs_f64().max(1e-9));
    for _ in 0..requests {
        let (t, _) = get(addr, "/")?;
        f.round_trip.push(t.as_secs_f64() * 1000.0);
    }
    Ok(())
}

struct Forward(Child);

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the benchmark.
pub fn run(args: PortForwardArgs) -> anyhow::Result<()> {
    let runs = args.runs.max(1);
    // Taken before the run: the figures belong to the code and machine at its start.
    let provenance = Provenance::probe(format!(
        "cargo xtask bench port-forward --runs {runs} --requests {}",
        args.requests
    ));
    let kubeconfig = args
        .kubeconfig
        .clone()
        .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from))
        .unwrap_or_else(|| crate::target_dir().join("cluster/kubeconfig"));
    // The plugin as users install it: the debug build relays far slower.
    let plugin = super::start::plugin_binary()?;
    let kube = Kube::new(kubeconfig.clone());
    let ns = format!("bench-pf-{}", std::process::id());
    kube.run(&["create", "namespace", &ns], None)?;
    let result = (|| -> anyhow::Result<(PathFigures, PathFigures)> {
        kube.run(&["apply", "-f", "-"], Some(&super::test_guest_vm(VM, &ns)))?;
        let deadline = Instant::now() + Duration::from_secs(300);
        let pod_ip = loop {
            let pod_ip = kube
                .run(
                    &[
                        "-n",
                        &ns,
                        "get",
                        "vmi",
                        VM,
                        "-o",
                        "jsonpath={.status.interfaces[0].ipAddress}",
                    ],
                    None,
                )
                .unwrap_or_default();
            let direct = format!("{pod_ip}:80");
            if !pod_ip.is_empty() && get(&direct, "/").is_ok_and(|(_, n)| n > 0) {
                break pod_ip;
            }
            if Instant::now() > deadline {
                bail!("the guest did not answer on {direct} within 300 s");
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let direct = format!("{pod_ip}:80");
        let mut child = Command::new(&plugin)
            .args(["port-forward", &format!("vm/{VM}"), "0:80", "-n", &ns])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting kubectl-virt port-forward")?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            BufReader::new(out).read_line(&mut line)?;
        }
        let _forward = Forward(child);
        let forwarded = line
            .strip_prefix("Forwarding from ")
            .and_then(|l| l.split(" -> ").next())
            .with_context(|| format!("unexpected port-forward output {line:?}"))?
            .to_string();
        // A first request through each path, not measured (connections, caches).
        get(&direct, "/")?;
        get(&forwarded, "/")?;
        let (mut d, mut p) = (PathFigures::default(), PathFigures::default());
        for n in 0..runs {
            measure(&direct, args.requests, &mut d)?;
            measure(&forwarded, args.requests, &mut p)?;
            eprintln!(
                "run {n}: direct {:.1} MiB/s, port-forward {:.1} MiB/s",
                d.throughput.last().unwrap_or(&0.0),
                p.throughput.last().unwrap_or(&0.0)
            );
        }
        Ok((d, p))
    })();
    let _ = kube.run(&["delete", "namespace", &ns, "--wait=false"], None);
    let (direct, forward) = result?;
    let table = table(&direct, &forward, runs, args.requests);
    print!("{table}");
    let description = format!(
        "One test guest (TCG, 256 MiB) on the local cluster serving HTTP with busybox httpd. \
         Direct: a TCP connection from the node to the VMI's pod IP (masquerade, the guest \
         behind it). Port-forward: `kubectl virt port-forward vm/pf 0:80` on the node, so each \
         connection goes kubectl-virt → kube-apiserver (aggregation, TLS) → virt-apiserver → \
         virt-handler (mTLS) → the guest from inside the pod's network namespace. The two paths \
         alternate in one run. Download: `GET /zeros` ({} MiB from the guest's memory); round \
         trip: `GET /` of a ~100-byte page on a new connection (for port-forward a new \
         websocket each time, as ssh's ProxyCommand opens one). Goal: port-forward ≥ 50 % of \
         direct throughput. kubectl-virt is a release build, as installed.",
        virt_testguest::ZEROS_BYTES / (1024 * 1024),
    );
    super::record_table(
        section::PORT_FORWARD,
        provenance,
        &description,
        &table,
        args.no_docs,
    )
}

fn table(direct: &PathFigures, forward: &PathFigures, runs: usize, requests: usize) -> String {
    let row = |name: &str, f: &PathFigures| {
        format!(
            "| {name} | {} | {} |\n",
            Runs::new(f.throughput.iter().copied()).summary(1, "MiB/s"),
            Runs::new(f.round_trip.iter().copied()).summary(1, "ms"),
        )
    };
    let median = |v: &[f64]| Runs::new(v.iter().copied()).median().unwrap_or(0.0);
    let (d, p) = (median(&direct.throughput), median(&forward.throughput));
    format!(
        "| path | download, median of {runs} (min–max) | GET /, median of {} (min–max) |\n|---|---|---|\n{}{}\n\
         Port-forward throughput: {:.0} % of direct.\n",
        runs * requests,
        row("direct to the pod IP", direct),
        row("kubectl virt port-forward", forward),
        if d > 0.0 { p / d * 100.0 } else { 0.0 },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_reports_medians_spreads_and_the_ratio() {
        let d = PathFigures {
            throughput: vec![40.0, 50.0, 45.0],
            round_trip: vec![2.0, 3.0, 4.0],
        };
        let p = PathFigures {
            throughput: vec![20.0, 30.0, 25.0],
            round_trip: vec![10.0, 12.0, 11.0],
        };
        let t = table(&d, &p, 3, 1);
        assert!(
            t.contains("| direct to the pod IP | 45.0 MiB/s (40.0–50.0) | 3.0 ms (2.0–4.0) |"),
            "{t}"
        );
        assert!(
            t.contains(
                "| kubectl virt port-forward | 25.0 MiB/s (20.0–30.0) | 11.0 ms (10.0–12.0) |"
            ),
            "{t}"
        );
        assert!(t.contains("56 % of direct"), "{t}");
    }
}
