//! `cargo xtask bench …`: benchmarks that print a summary and record their figures in
//! their own section of docs/benchmarks.md.

use std::path::PathBuf;

use anyhow::Context;

mod apiserver;
mod crd;
mod drain;
mod migrate;
mod network;
mod portforward;
pub(crate) mod report;
mod start;

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Which benchmark to run.
    #[command(subcommand)]
    pub bench: Bench,
}

/// The benchmarks. Each owns one section of docs/benchmarks.md.
#[derive(clap::Subcommand, Debug)]
pub enum Bench {
    /// virt-apiserver on etcd: create throughput, LIST, watch fan-out latency, memory.
    Apiserver(apiserver::ApiserverArgs),
    /// virt-launcher: start → guest banner against bare QEMU in the same run, memory beside QEMU.
    Launcher(LauncherArgs),
    /// VM start density on the local cluster: VMs created 100 ms apart → Running, guest
    /// answering; API writes per start; control-plane memory.
    Start(start::StartArgs),
    /// Live migration of an idle 256 MiB guest between the two local nodes, against bare
    /// QEMU → QEMU in the same run.
    Migrate(migrate::MigrateArgs),
    /// `kubectl drain` of a node holding N idle LiveMigrate VMs, against one migration in
    /// the same run (two-node local cluster).
    Drain(drain::DrainArgs),
    /// The pod network: TCP throughput and HTTP round trips node → guest for masquerade and
    /// bridge against a bare tap in the same run, and how soon the guest answers after its
    /// DHCP lease (network namespaces of its own, no cluster).
    Network(network::NetworkArgs),
    /// `kubectl virt port-forward` against a direct connection to the VMI's pod IP, in one
    /// run: download throughput and small-request round trips (local cluster).
    PortForward(portforward::PortForwardArgs),
}

/// Arguments of the launcher benchmark.
#[derive(clap::Args, Debug)]
pub struct LauncherArgs {
    /// Boots per variant (bare QEMU and virt-launcher alternate).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
}

/// Heading of the launcher section (the guest module renders the table under it).
const LAUNCHER_HEADING: &str = "## Launcher (TCG, busybox guest, same run)";

fn launcher(args: LauncherArgs) -> anyhow::Result<()> {
    let bench = crate::guest::bench_launcher(args.runs.max(1))?;
    let table = bench.markdown();
    print!("{table}");
    if args.no_docs {
        return Ok(());
    }
    let machine = report::Machine::probe();
    let date = report::now_utc();
    let body = table.strip_prefix(LAUNCHER_HEADING).unwrap_or(&table);
    let section = format!(
        "{LAUNCHER_HEADING}\n\nCommand: `cargo xtask bench launcher --runs {}`; {date}; machine: {machine}. \
         The guest is the tiny busybox guest of `cargo xtask guest`; both variants boot the same \
         kernel and initramfs under TCG. Goals: overhead ≤ 1 s, ≤ 40 MiB per VM beside QEMU \
         (KubeVirt reserves 240 MiB).\n{body}",
        args.runs
    );
    let path = write_section(LAUNCHER_HEADING, &section)?;
    eprintln!("figures written to {}", path.display());
    Ok(())
}

/// A VM of the test guest (256 MiB, kernel boot from its image, 5 s grace) for the
/// cluster benchmarks.
fn test_guest_vm(name: &str, ns: &str) -> String {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "terminationGracePeriodSeconds": 5,
            "domain": {
                "memory": {"guest": "256Mi"},
                "devices": {},
                "firmware": {"kernelBoot": {
                    "kernelArgs": virt_testguest::KERNEL_ARGS,
                    "container": {"image": crate::images::TEST_GUEST_IMAGE, "imagePullPolicy": "IfNotPresent",
                        "kernelPath": "/vmlinuz", "initrdPath": "/initramfs.gz"}
                }}
            }
        }}}
    })
    .to_string()
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.bench {
        Bench::Apiserver(a) => apiserver::run(a),
        Bench::Launcher(a) => launcher(a),
        Bench::Start(a) => start::run(a),
        Bench::Migrate(a) => migrate::run(a),
        Bench::Drain(a) => drain::run(a),
        Bench::Network(a) => network::run(a),
        Bench::PortForward(a) => portforward::run(a),
    }
}

/// docs/benchmarks.md of the workspace.
fn docs_path() -> PathBuf {
    crate::workspace_root().join("docs").join("benchmarks.md")
}

/// Replaces (or appends) the section under `heading` in docs/benchmarks.md.
fn write_section(heading: &str, section: &str) -> anyhow::Result<PathBuf> {
    let path = docs_path();
    // Read right before writing: other benchmarks may have updated their sections
    // while this one ran, and those must survive.
    let doc = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let out = report::replace_section(&doc, heading, section);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("md.tmp");
    std::fs::write(&tmp, out).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(path)
}
