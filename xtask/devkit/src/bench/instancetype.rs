//! `cargo xtask bench instancetype`: create → VMI Running of a VM sized by a (namespaced)
//! instance type and preference, against the same VM written out in full, alternating in one
//! run on the local cluster (issue 40 point 8; goal: ≤ +5 %).
//!
//! Both VMs boot the test guest with 256 MiB and a 5 s grace period: one says so in its
//! template, the other leaves memory and grace period out and names an instance type (256 MiB)
//! and a preference (5 s). The instance-typed one costs virt-apiserver a read of both
//! references at admission and virt-controller two ControllerRevisions before its VMI: that
//! is what is measured. Each VM is created through kube-apiserver, its VMI polled every 50 ms
//! until Running, then the VM is deleted and its launcher pod waited out before the next.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::section::{self, Provenance, Runs, Section};
use crate::deploy::Kubectl as Kube;

/// Arguments of `cargo xtask bench instancetype`.
#[derive(clap::Args, Debug, Clone)]
pub struct InstancetypeArgs {
    /// Starts per variant (they alternate; one unmeasured start of each comes first).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Kubeconfig of the cluster (default: $KUBECONFIG, then the local cluster's).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
}

impl InstancetypeArgs {
    /// The command that reproduces this run, every option spelt out.
    pub fn command(&self) -> String {
        format!("cargo xtask bench instancetype --runs {}", self.runs)
    }
}

/// The two VMs compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Full,
    Sized,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Sized => "sized",
        }
    }
}

const INSTANCETYPE: &str = "bench-small";
const PREFERENCE: &str = "bench-pref";

/// The VM of `variant`: the test guest, its size either written out or taken from the
/// instance type and preference.
fn vm(variant: Variant, ns: &str) -> Value {
    let mut vm: Value = serde_json::from_str(&super::test_guest_vm(variant.name(), ns))
        .unwrap_or_else(|_| json!({}));
    if variant == Variant::Sized {
        vm["spec"]["instancetype"] =
            json!({"name": INSTANCETYPE, "kind": "VirtualMachineInstancetype"});
        vm["spec"]["preference"] = json!({"name": PREFERENCE, "kind": "VirtualMachinePreference"});
        if let Some(t) = vm["spec"]["template"]["spec"].as_object_mut() {
            t.remove("terminationGracePeriodSeconds");
        }
        if let Some(d) = vm["spec"]["template"]["spec"]["domain"].as_object_mut() {
            d.remove("memory");
        }
    }
    vm
}

/// The instance type and preference the sized VM names (what the full one writes out).
fn references(ns: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "instancetype.kubevirt.io/v1beta1", "kind": "VirtualMachineInstancetype",
         "metadata": {"name": INSTANCETYPE, "namespace": ns},
         "spec": {"cpu": {"guest": 1}, "memory": {"guest": "256Mi"}}},
        {"apiVersion": "instancetype.kubevirt.io/v1beta1", "kind": "VirtualMachinePreference",
         "metadata": {"name": PREFERENCE, "namespace": ns},
         "spec": {"preferredTerminationGracePeriodSeconds": 5}}
    ]})
}

/// The figures as a markdown table: each variant's median (min–max) and the difference of
/// the medians against the goal.
pub fn table(full: &[Duration], sized: &[Duration]) -> String {
    let (f, s) = (Runs::secs(full), Runs::secs(sized));
    let diff = match (f.median(), s.median()) {
        (Some(f), Some(s)) if f > 0.0 => Some((s - f) / f * 100.0),
        _ => None,
    };
    let diff_text = diff.map_or_else(|| "n/a".to_string(), |d| format!("{d:+.1} %"));
    let met = match diff {
        Some(d) if d <= 5.0 => "met",
        Some(_) => "not met",
        None => "n/a",
    };
    format!(
        "| figure | median (min–max) over {} starts each |\n|---|---|\n\
         | create → VMI Running, VM written out in full | {} |\n\
         | create → VMI Running, VM sized by an instance type and a preference | {} |\n\
         | instance-typed against full, medians | {diff_text} |\n\
         | goal: ≤ +5 % | {met} |\n",
        full.len().min(sized.len()),
        f.summary(2, "s"),
        s.summary(2, "s"),
    )
}

/// The cluster through kube-apiserver with the kubeconfig's credentials.
struct Api {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    server: String,
    ns: String,
}

impl Api {
    fn new(kube: &Kube, ns: &str) -> anyhow::Result<Self> {
        let (client, server) = super::api_client(kube)?;
        Ok(Self {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            client,
            server,
            ns: ns.to_string(),
        })
    }

    fn vms(&self) -> String {
        format!(
            "{}/apis/kubevirt.io/v1/namespaces/{}/virtualmachines",
            self.server, self.ns
        )
    }

    /// GET `url`: its status and JSON body (`Null` when not JSON).
    fn get(&self, url: String) -> anyhow::Result<(reqwest::StatusCode, Value)> {
        self.rt.block_on(async {
            let r = self.client.get(url).send().await?;
            let status = r.status();
            Ok((status, r.json().await.unwrap_or(Value::Null)))
        })
    }

    fn vmi_phase(&self, name: &str) -> anyhow::Result<Option<String>> {
        let (status, v) = self.get(format!(
            "{}/apis/kubevirt.io/v1/namespaces/{}/virtualmachineinstances/{name}",
            self.server, self.ns
        ))?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            bail!("reading VMI {name}: {status} {v}");
        }
        Ok(Some(
            v["status"]["phase"].as_str().unwrap_or("").to_string(),
        ))
    }

    fn pods(&self) -> anyhow::Result<usize> {
        let (status, v) = self.get(format!(
            "{}/api/v1/namespaces/{}/pods",
            self.server, self.ns
        ))?;
        if !status.is_success() {
            bail!("listing pods: {status} {v}");
        }
        Ok(v["items"].as_array().map_or(0, Vec::len))
    }

    /// Creates `vm` and times create request → VMI Running.
    fn start(&self, vm: &Value) -> anyhow::Result<Duration> {
        let name = vm["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let t = Instant::now();
        let (status, body) = self.rt.block_on(async {
            let r = self.client.post(self.vms()).json(vm).send().await?;
            let status = r.status();
            anyhow::Ok((status, r.text().await.unwrap_or_default()))
        })?;
        if !status.is_success() {
            bail!("creating VM {name}: {status} {body}");
        }
        while t.elapsed() < Duration::from_secs(300) {
            if self.vmi_phase(&name)?.as_deref() == Some("Running") {
                return Ok(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("VM {name} not Running within 300 s")
    }

    /// Deletes VM `name` and waits until its VMI and every pod of the namespace are gone,
    /// so that the next start has the machine to itself.
    fn stop(&self, name: &str) -> anyhow::Result<()> {
        self.rt.block_on(async {
            self.client
                .delete(format!("{}/{name}", self.vms()))
                .send()
                .await?
                .error_for_status()
        })?;
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(300) {
            if self.vmi_phase(name)?.is_none() && self.pods()? == 0 {
                let (status, _) = self.get(format!("{}/{name}", self.vms()))?;
                if status == reqwest::StatusCode::NOT_FOUND {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        bail!("VM {name} and its pods not gone within 300 s")
    }
}

const DESCRIPTION: &str = "Create → VMI `Running` (through kube-apiserver, the VMI polled every \
    50 ms) of two VMs of the test guest (busybox initramfs, TCG) on the two-node local cluster, \
    alternating, one at a time (each deleted and its pod gone before the next): one writes \
    256 MiB and a 5 s grace period in its template, the other leaves both out and names a \
    namespaced instance type (1 vCPU, 256 MiB) and preference (5 s). The difference is \
    virt-apiserver reading both references at admission and virt-controller capturing them \
    as two ControllerRevisions before it creates the VMI. One unmeasured start of each \
    comes first.";

pub fn run(args: InstancetypeArgs) -> anyhow::Result<()> {
    let provenance = Provenance::probe(args.command());
    let kube = Kube::new(crate::deploy::kubeconfig(args.kubeconfig.clone()));
    // The build the figures belong to: a `dev-*` tag is the debug profile (what the e2e
    // tests deploy), others the release one.
    let image = kube
        .run(
            &[
                "get",
                "deployment",
                "virt-controller",
                "-n",
                "kubevirt",
                "-o",
                "jsonpath={.spec.template.spec.containers[0].image}",
            ],
            None,
        )
        .context("kubevirt-rs is not deployed (cargo xtask up)")?;
    let ns = format!("bench-instancetype-{}", std::process::id());
    kube.run(&["create", "namespace", &ns], None)?;
    let result = (|| -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
        kube.run(&["apply", "-f", "-"], Some(&references(&ns).to_string()))?;
        let api = Api::new(&kube, &ns)?;
        let (mut full, mut sized) = (Vec::new(), Vec::new());
        let runs = args.runs.max(1);
        for i in 0..=runs {
            // Alternate which goes first, so neither always follows the other's teardown.
            let order = if i % 2 == 0 {
                [Variant::Full, Variant::Sized]
            } else {
                [Variant::Sized, Variant::Full]
            };
            for v in order {
                let took = api.start(&vm(v, &ns))?;
                api.stop(v.name())?;
                if i == 0 {
                    eprintln!("warm-up {}: {took:.2?}", v.name());
                    continue;
                }
                eprintln!("run {i} {}: {took:.2?}", v.name());
                match v {
                    Variant::Full => full.push(took),
                    Variant::Sized => sized.push(took),
                }
            }
        }
        Ok((full, sized))
    })();
    let _ = kube.run(&["delete", "namespace", &ns, "--wait=false"], None);
    let (full, sized) = result?;
    let table = table(&full, &sized);
    print!("{table}");
    let section = Section::new(
        section::INSTANCETYPE,
        provenance,
        format!(
            "{DESCRIPTION} Deployed: `{}`{}.\n\n{table}",
            image.trim(),
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
    fn the_sized_vm_leaves_out_what_the_references_give() {
        let full = vm(Variant::Full, "ns");
        let sized = vm(Variant::Sized, "ns");
        let t = |v: &Value| v["spec"]["template"]["spec"].clone();
        assert_eq!(t(&full)["domain"]["memory"]["guest"], "256Mi");
        assert_eq!(t(&full)["terminationGracePeriodSeconds"], 5);
        assert!(t(&sized)["domain"].get("memory").is_none());
        assert!(t(&sized).get("terminationGracePeriodSeconds").is_none());
        assert_eq!(sized["spec"]["instancetype"]["name"], INSTANCETYPE);
        assert_eq!(sized["spec"]["preference"]["name"], PREFERENCE);
        let refs = references("ns");
        assert_eq!(refs["items"][0]["spec"]["memory"]["guest"], "256Mi");
        assert_eq!(
            refs["items"][1]["spec"]["preferredTerminationGracePeriodSeconds"],
            5
        );
    }

    #[test]
    fn the_table_compares_the_medians_against_the_goal() {
        let s = |v: &[f64]| {
            v.iter()
                .map(|x| Duration::from_secs_f64(*x))
                .collect::<Vec<_>>()
        };
        let t = table(&s(&[2.0, 2.2, 2.1]), &s(&[2.1, 2.3, 2.2]));
        assert!(t.contains("+4.8 %"), "{t}");
        assert!(t.contains("| goal: ≤ +5 % | met |"), "{t}");
        let t = table(&s(&[2.0]), &s(&[2.2]));
        assert!(t.contains("not met"), "{t}");
    }
}
