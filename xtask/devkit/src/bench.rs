//! `cargo xtask bench …`: benchmarks that print a summary and record their figures in
//! their own generated section of docs/benchmarks.md (section.rs: provenance, markers,
//! median with min–max); `bench all` runs every one of them and so rebuilds the document.

use std::path::PathBuf;

use anyhow::Context;

mod abuse;
mod all;
mod apiserver;
mod crd;
mod drain;
mod etcd_drain;
mod hotplug;
mod instancetype;
mod memory;
mod migrate;
mod network;
mod pool;
mod portforward;
pub(crate) mod report;
mod scale;
mod scrape;
pub(crate) mod section;
mod start;
mod storage;

use all::AllArgs;
use section::Section;

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
    /// A normal client's latency while another abuses virt-apiserver: JSON Patch copy bomb,
    /// 10k silent connections, 5000 watches of one user, 64 MiB bodies, deeply nested JSON.
    Abuse(abuse::AbuseArgs),
    /// virt-apiserver through kube-apiserver's aggregator against a CRD of the same kind in
    /// that kube-apiserver, each on a fresh etcd of its own (a private kube-apiserver, no
    /// cluster): creates, memory per stored object, LIST, watch delivery, updates, and the
    /// aggregator's own overhead.
    Crd(crd::CrdArgs),
    /// virt-launcher: start → guest banner against bare QEMU in the same run, memory beside QEMU.
    Launcher(LauncherArgs),
    /// VM start on the local cluster: each step from the create request to the guest's
    /// banner (one VM at a time against bare QEMU, then a burst of 10), then density (VMs
    /// created 100 ms apart → Running, guest answering; API writes per start; control-plane
    /// memory).
    Start(start::StartArgs),
    /// Live migration of an idle 256 MiB guest between the two local nodes, against bare
    /// QEMU → QEMU in the same run.
    Migrate(migrate::MigrateArgs),
    /// Persistent disks: guest disk throughput on a claim against bare QEMU on a host file,
    /// and live migration of a 1 GiB ReadWriteOnce claim against `qemu-img convert` (two-node
    /// local cluster).
    Storage(storage::StorageArgs),
    /// `kubectl drain` of a node holding N idle LiveMigrate VMs, against one migration in
    /// the same run (two-node local cluster).
    Drain(drain::DrainArgs),
    /// `kubectl drain` of the node holding etcd (one member on a node-local claim) while the
    /// VM API is written through kube-apiserver: how long it did not answer, writes lost with
    /// retries, how long the member's move took (two-node local cluster).
    EtcdDrain(etcd_drain::EtcdDrainArgs),
    /// Create → VMI Running of a VM sized by an instance type and preference against the
    /// same VM written out in full, alternating in one run (local cluster).
    Instancetype(instancetype::InstancetypeArgs),
    /// One Prometheus scrape of virt-handler with N running VMs on its node (time, bytes),
    /// and virt-handler's memory per VM (local cluster).
    Scrape(scrape::ScrapeArgs),
    /// Volume hotplug: `addvolume` → the volume Ready, `removevolume` → gone (local cluster).
    Hotplug(hotplug::HotplugArgs),
    /// The pod network: TCP throughput and HTTP round trips node → guest for masquerade and
    /// bridge against a bare tap in the same run, and how soon the guest answers after its
    /// DHCP lease (network namespaces of its own, no cluster).
    Network(network::NetworkArgs),
    /// `kubectl virt port-forward` against a direct connection to the VMI's pod IP, in one
    /// run: download throughput and small-request round trips (local cluster).
    PortForward(portforward::PortForwardArgs),
    /// The control plane at scale without guests: KWOK's fake nodes (a private
    /// kube-apiserver, kube-scheduler, virt-apiserver and virt-controller, no cluster), VMs
    /// created at a fixed rate until every VMI runs: create → Running percentiles, memory
    /// and API requests per VMI, etcd size, failed requests.
    Scale(scale::ScaleArgs),
    /// `kubectl scale` of a VirtualMachinePool 0 → N → 0 on KWOK's fake nodes (bench
    /// scale's processes, no cluster): time to every VMI Running, then to every VM gone.
    Pool(pool::PoolArgs),
    /// Every benchmark above, one after the other, each writing its section: the whole of
    /// docs/benchmarks.md from one command (needs the two-node local cluster with
    /// kubevirt-rs deployed, and an otherwise idle machine; about 50 minutes on 2 CPUs).
    All(AllArgs),
}

/// Arguments of the launcher benchmark.
#[derive(clap::Args, Debug)]
pub struct LauncherArgs {
    /// Boots per variant (bare QEMU and virt-launcher alternate).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
}

fn launcher(args: LauncherArgs) -> anyhow::Result<()> {
    let runs = args.runs.max(1);
    // Taken before the run: the figures belong to the code and machine at its start.
    let provenance =
        section::Provenance::probe(format!("cargo xtask bench launcher --runs {runs}"));
    let bench = crate::guest::bench_launcher(runs)?;
    let body = format!(
        "Three variants boot the tiny busybox guest of `cargo xtask guest` (same kernel and \
         initramfs, TCG), alternating, {runs} boots each: bare QEMU, virt-launcher as root \
         (libvirt's daemon in root mode: how the launcher ran in its privileged pod before \
         issue 15's hardening) and virt-launcher as a launcher pod runs it (an ordinary \
         user — `nobody` here, uid 107 in a pod, whose image has a passwd entry for it —, no \
         capability, libvirt in session mode, its own QEMU capabilities cache), so the \
         hardening's cost is measured in the same run. One unmeasured boot of each launcher \
         warms its capabilities cache (a pod's comes seeded by virt-handler). Memory is \
         measured once, at the last launcher's banner. Goals: overhead ≤ 1 s, ≤ 40 MiB per VM \
         beside QEMU (KubeVirt reserves 240 MiB).\n\n{}",
        bench.markdown()
    );
    print!("{body}");
    record(
        &Section::new(section::LAUNCHER, provenance, body),
        args.no_docs,
    )
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
        Bench::Abuse(a) => abuse::run(a),
        Bench::Crd(a) => crd::run(a),
        Bench::Launcher(a) => launcher(a),
        Bench::Start(a) => start::run(a),
        Bench::Migrate(a) => migrate::run(a),
        Bench::Drain(a) => drain::run(a),
        Bench::EtcdDrain(a) => etcd_drain::run(a),
        Bench::Instancetype(a) => instancetype::run(a),
        Bench::Scrape(a) => scrape::run(a),
        Bench::Hotplug(a) => hotplug::run(a),
        Bench::Storage(a) => storage::run(a),
        Bench::Network(a) => network::run(a),
        Bench::PortForward(a) => portforward::run(a),
        Bench::Scale(a) => scale::run(a),
        Bench::Pool(a) => pool::run(a),
        Bench::All(a) => all::run(a),
    }
}

/// A client of kube-apiserver with the kubeconfig's own credentials.
pub(crate) fn api_client(
    kube: &crate::deploy::Kubectl,
) -> anyhow::Result<(reqwest::Client, String)> {
    use base64::Engine as _;
    let raw = kube.run(&["config", "view", "--raw", "--minify", "-o", "json"], None)?;
    let cfg: serde_json::Value = serde_json::from_str(&raw).context("kubeconfig as JSON")?;
    let b64 = |v: &serde_json::Value| -> anyhow::Result<Vec<u8>> {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().context("inline kubeconfig data")?)
            .context("kubeconfig data")
    };
    let server = cfg["clusters"][0]["cluster"]["server"]
        .as_str()
        .context("kubeconfig server")?
        .to_string();
    let ca = b64(&cfg["clusters"][0]["cluster"]["certificate-authority-data"])?;
    let mut identity = b64(&cfg["users"][0]["user"]["client-certificate-data"])?;
    identity.extend(b64(&cfg["users"][0]["user"]["client-key-data"])?);
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
        .identity(reqwest::Identity::from_pem(&identity)?)
        .use_rustls_tls()
        .timeout(std::time::Duration::from_secs(10))
        .build()?;
    Ok((client, server))
}

/// docs/benchmarks.md of the workspace.
fn docs_path() -> PathBuf {
    crate::workspace_root().join("docs").join("benchmarks.md")
}

/// Writes `section` into docs/benchmarks.md unless `no_docs` (the benchmark has printed
/// its figures either way).
fn record(section: &Section, no_docs: bool) -> anyhow::Result<()> {
    if no_docs {
        return Ok(());
    }
    let path = write_generated(section.slot.key, &section.render())?;
    eprintln!("figures written to {}", path.display());
    Ok(())
}

/// [`record`] of the usual section: its description, a blank line, its table.
fn record_table(
    slot: section::Slot,
    provenance: section::Provenance,
    description: &str,
    table: &str,
    no_docs: bool,
) -> anyhow::Result<()> {
    let section = Section::new(slot, provenance, format!("{description}\n\n{table}"));
    record(&section, no_docs)
}

/// Replaces (or appends) the generated section `key` in docs/benchmarks.md.
fn write_generated(key: &str, rendered: &str) -> anyhow::Result<PathBuf> {
    let path = docs_path();
    // Read right before writing: other benchmarks may have updated their sections
    // while this one ran, and those must survive.
    let doc = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let out = section::replace_generated(&doc, key, rendered)
        .with_context(|| format!("updating {}", path.display()))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("md.tmp");
    std::fs::write(&tmp, out).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(path)
}
