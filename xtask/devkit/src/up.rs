//! `cargo xtask up`: local cluster, images, kubevirt-rs, a demo VM. Every step reuses what exists,
//! so running it again is cheap and changes nothing that is current.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kubevirt_api::VirtualMachine;

use crate::{cluster, deploy, images};

/// Arguments of `cargo xtask up`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Do not create the demo VM.
    #[arg(long)]
    pub no_demo: bool,
    /// Use the images of the last `cargo xtask images` instead of building.
    #[arg(long)]
    pub no_build: bool,
    /// How long the demo VM may take to run.
    #[arg(long, default_value_t = 300)]
    pub timeout_seconds: u64,
    /// Nodes of the local cluster (1, or 2 for live migration; `cargo xtask cluster up`).
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// Also run Prometheus on the cluster, scraping kubevirt-rs as a cluster's Prometheus
    /// does (http://127.0.0.1:9090; docs/local-cluster.md).
    #[arg(long)]
    pub prometheus: bool,
}

/// The demo VM: runs the test guest (busybox initramfs, kernelBoot from the test-guest image)
/// under QEMU's TCG (virt-controller allows emulation on our clusters).
fn demo_vm() -> anyhow::Result<VirtualMachine> {
    let vm = serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": DEMO, "namespace": "default", "labels": {"app": "demo"}},
        "spec": {
            "runStrategy": "Always",
            "template": {"spec": {
                // The busybox guest ignores the ACPI button: `kubectl virt stop` waits this long.
                "terminationGracePeriodSeconds": 5,
                "domain": {
                    "memory": {"guest": "128Mi"},
                    "devices": {},
                    "firmware": {"kernelBoot": {
                        "kernelArgs": virt_testguest::KERNEL_ARGS,
                        "container": {
                            "image": images::TEST_GUEST_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "kernelPath": "/vmlinuz",
                            "initrdPath": "/initramfs.gz"
                        }
                    }}
                }
            }}
        }
    });
    serde_json::from_value(vm).context("the demo VM does not parse as a VirtualMachine")
}

const DEMO: &str = "demo";

/// Waits until the demo's VMI is Running, printing each change of its phase and of its launcher
/// pod on the way.
fn wait_running(k: &deploy::Kubectl, timeout: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut last = String::new();
    let mut last_failure = String::new();
    while start.elapsed() < timeout {
        let vmi = k
            .run(
                &[
                    "-n",
                    "default",
                    "get",
                    "vmi",
                    DEMO,
                    "--ignore-not-found",
                    "-o",
                    "jsonpath={.status.phase} {.status.nodeName}",
                ],
                None,
            )
            .unwrap_or_default();
        let pod = k
            .run(
                &[
                    "-n",
                    "default",
                    "get",
                    "pods",
                    "-l",
                    &format!("kubevirt.io=virt-launcher,vm.kubevirt.io/name={DEMO}"),
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name} {.status.phase} (init: \
                     {.status.initContainerStatuses[*].state.*.reason}; compute: \
                     {.status.containerStatuses[*].state.*.reason}) {end}",
                ],
                None,
            )
            .unwrap_or_default();
        // A failed launcher pod goes away with its VMI: keep its last words.
        let failure = k.run(
            &[
                "-n",
                "default",
                "get",
                "pods",
                "-l",
                &format!("kubevirt.io=virt-launcher,vm.kubevirt.io/name={DEMO}"),
                "-o",
                "jsonpath={.items[*].status.containerStatuses[*].state.terminated.message}",
            ],
            None,
        );
        match failure {
            Ok(msg) if !msg.trim().is_empty() && msg != last_failure => {
                println!("  launcher pod failed:\n{}", msg.trim());
                last_failure = msg;
            }
            _ => {}
        }
        let vmi = vmi.trim();
        let now = format!(
            "VMI {}; launcher pod {}",
            if vmi.is_empty() {
                "not created yet"
            } else {
                vmi
            },
            if pod.trim().is_empty() {
                "none"
            } else {
                pod.trim()
            }
        );
        if now != last {
            println!("  {:5.1} s  {now}", start.elapsed().as_secs_f64());
            last = now;
        }
        if vmi.starts_with("Running") {
            return Ok(start.elapsed());
        }
        if vmi.starts_with("Failed") {
            bail!("the demo VMI failed:\n{}", demo_diagnosis(k));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!(
        "the demo VMI is not Running after {timeout:?}:\n{}",
        demo_diagnosis(k)
    )
}

fn demo_diagnosis(k: &deploy::Kubectl) -> String {
    let mut out = String::new();
    for args in [
        vec!["-n", "default", "get", "vm,vmi,pods", "-o", "wide"],
        vec!["-n", "default", "describe", "vmi", DEMO],
        vec![
            "-n",
            "default",
            "logs",
            "-l",
            "kubevirt.io=virt-launcher",
            "--all-containers",
            "--tail=30",
        ],
        vec![
            "-n",
            "kubevirt",
            "logs",
            "deployment/virt-controller",
            "--tail=20",
        ],
        vec![
            "-n",
            "kubevirt",
            "logs",
            "daemonset/virt-handler",
            "--tail=20",
        ],
    ] {
        match k.run(&args, None) {
            Ok(s) => out.push_str(&s),
            Err(e) => out.push_str(&format!("{e:#}\n")),
        }
    }
    out
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let start = Instant::now();
    let kubeconfig = cluster::ensure_up_nodes(None, args.nodes)?;
    println!("cluster up ({:.1} s)", start.elapsed().as_secs_f64());
    let report = deploy::deploy(&deploy::Args {
        kubeconfig: Some(kubeconfig.clone()),
        timeout_seconds: 180,
        no_build: args.no_build,
        ..deploy::Args::default()
    })?;
    let k = deploy::Kubectl {
        bin: report.kubectl,
        kubeconfig: kubeconfig.clone(),
    };
    if args.prometheus {
        cluster::prometheus_up()?;
    }
    if !args.no_demo {
        let yaml = serde_saphyr::to_string(&demo_vm()?).context("rendering the demo VM")?;
        // Server-side apply: creates it once, later runs leave a current object alone.
        k.run(
            &[
                "apply",
                "--server-side",
                "--field-manager=kubevirt-rs-up",
                "-f",
                "-",
            ],
            Some(&yaml),
        )
        .context("creating the demo VM")?;
        println!("demo VM applied (runStrategy Always); waiting for its VMI to run:");
        let took = wait_running(&k, Duration::from_secs(args.timeout_seconds))?;
        println!("demo VMI Running {:.1} s after apply", took.as_secs_f64());
    }
    crate::user_bin::build_plugin()?;
    let bin = crate::user_bin::link(&cluster::kubernetes_bin_dir()?)?;
    let vms = k.run(&["get", "vms", "-A"], None)?;
    println!(
        "\nkubevirt-rs is up ({:.1} s).\n\n{vms}",
        start.elapsed().as_secs_f64()
    );
    println!(
        "Next ({} holds kubectl, built for this cluster, and kubectl-virt):\n{}\n  \
         export KUBECONFIG={}\n  kubectl get vms\n  \
         kubectl get vmi,pods -o wide\n  kubectl virt console demo    # Ctrl+] leaves\n  \
         kubectl virt pause vm demo; \
         kubectl virt unpause vm demo\n  kubectl virt stop demo; kubectl virt start demo\n  \
         kubectl explain vm.spec\n\nStop everything: cargo xtask cluster down",
        bin.display(),
        crate::user_bin::path_line(),
        kubeconfig.display(),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn demo_vm_is_a_virtual_machine() {
        let vm = super::demo_vm().unwrap_or_else(|e| panic!("{e:#}"));
        let yaml = serde_saphyr::to_string(&vm).unwrap_or_default();
        assert!(
            yaml.contains("kernelBoot") && yaml.contains("test-guest"),
            "{yaml}"
        );
    }
}
