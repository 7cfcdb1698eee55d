//! `cargo xtask bench hotplug`: how long a volume hotplug takes (issue 44 point 6): from the
//! `addvolume` request to the volume `Ready` (its attachment pod scheduled and running, the
//! claim's image mounted into the launcher pod, libvirt's live attach done), and from
//! `removevolume` to the volume gone (unplugged, unmounted, its entry dropped).
//!
//! On the local cluster: one VM of the test guest; each run adds a fresh claim of the
//! default StorageClass (local-path, bound on first use) through the VMI's `addvolume`
//! subresource (what `virtctl addvolume` sends, through kube-apiserver), polls the VMI's
//! `status.volumeStatus` every 100 ms, then removes it the same way.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use super::section::{self, Provenance, Runs};
use crate::deploy::Kubectl as Kube;

/// Arguments of `cargo xtask bench hotplug`.
#[derive(clap::Args, Debug, Clone)]
pub struct HotplugArgs {
    /// Volumes hotplugged and removed, one after another.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Kubeconfig of the cluster (default: $KUBECONFIG, then the local cluster's).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
}

impl HotplugArgs {
    /// The command that reproduces this run, every option spelt out.
    pub fn command(&self) -> String {
        format!("cargo xtask bench hotplug --runs {}", self.runs)
    }
}

/// The measured times of each run.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub add_to_ready: Vec<Duration>,
    pub remove_to_gone: Vec<Duration>,
}

pub fn table(f: &Figures) -> String {
    format!(
        "| step, median (min–max) of {} | time |\n|---|---|\n\
         | `addvolume` → volume `Ready` (attachment pod running, image mounted, libvirt attached) | {} |\n\
         | `removevolume` → volume gone from `volumeStatus` (unplugged, unmounted) | {} |\n",
        f.add_to_ready.len(),
        Runs::secs(&f.add_to_ready).summary(1, "s"),
        Runs::secs(&f.remove_to_gone).summary(1, "s"),
    )
}

const DESCRIPTION: &str = "One VM of the test guest (busybox initramfs, TCG) on the local \
    cluster; each run creates a 64 MiB claim of the default StorageClass (local-path, bound \
    when its attachment pod is scheduled), PUTs `AddVolumeOptions` (SCSI disk, serial = name) to \
    the VMI's `addvolume` subresource through kube-apiserver, as upstream `virtctl addvolume` \
    does, and polls the VMI's `status.volumeStatus` every 100 ms with kubectl; then the same \
    for `removevolume`. `Ready` means libvirt's live attach returned; the guest kernel's SCSI \
    scan follows by itself (the e2e test finds the disk by serial).";

/// The phase of volume `v` of VMI `vmi`, or "" without an entry.
fn phase(kube: &Kube, ns: &str, vmi: &str, v: &str) -> anyhow::Result<String> {
    Ok(kube
        .run(
            &[
                "get",
                "vmi",
                "-n",
                ns,
                vmi,
                "-o",
                &format!("jsonpath={{.status.volumeStatus[?(@.name==\"{v}\")].phase}}"),
            ],
            None,
        )?
        .trim()
        .to_string())
}

/// Polls until `done` says so, at most `limit`; the time it took.
fn until(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    loop {
        if done()? {
            return Ok(t.elapsed());
        }
        if t.elapsed() > limit {
            bail!("{what} not reached within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// PUTs `body` to subresource `sub` of VMI `vmi`.
fn put(
    kube: &Kube,
    ns: &str,
    vmi: &str,
    sub: &str,
    body: &serde_json::Value,
) -> anyhow::Result<()> {
    let path = format!(
        "/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{vmi}/{sub}"
    );
    kube.run(
        &["replace", "--raw", &path, "-f", "-"],
        Some(&body.to_string()),
    )
    .with_context(|| format!("PUT {path}"))?;
    Ok(())
}

pub fn run(args: HotplugArgs) -> anyhow::Result<()> {
    let provenance = Provenance::probe(args.command());
    let kube = Kube::new(crate::deploy::kubeconfig(args.kubeconfig.clone()));
    let ns = format!("bench-hotplug-{}", std::process::id());
    kube.run(&["create", "namespace", &ns], None)
        .context("no cluster (cargo xtask up)")?;
    let result = (|| -> anyhow::Result<Figures> {
        kube.run(
            &["apply", "-f", "-"],
            Some(&super::test_guest_vm("hp", &ns)),
        )?;
        until("VMI hp Running", Duration::from_secs(300), || {
            Ok(kube
                .run(
                    &[
                        "get",
                        "vmi",
                        "-n",
                        &ns,
                        "hp",
                        "--ignore-not-found",
                        "-o",
                        "jsonpath={.status.phase}",
                    ],
                    None,
                )?
                .trim()
                == "Running")
        })?;
        let mut f = Figures::default();
        for i in 0..args.runs {
            let v = format!("vol-{i}");
            let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": v, "namespace": ns},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "64Mi"}}}});
            kube.run(&["apply", "-f", "-"], Some(&claim.to_string()))?;
            let add = json!({"name": v, "disk": {"disk": {"bus": "scsi"}, "serial": v},
                "volumeSource": {"persistentVolumeClaim": {"claimName": v, "hotpluggable": true}}});
            let t = Instant::now();
            put(&kube, &ns, "hp", "addvolume", &add)?;
            until(&format!("{v} Ready"), Duration::from_secs(180), || {
                Ok(phase(&kube, &ns, "hp", &v)? == "Ready")
            })?;
            f.add_to_ready.push(t.elapsed());
            let t = Instant::now();
            put(&kube, &ns, "hp", "removevolume", &json!({"name": v}))?;
            until(&format!("{v} gone"), Duration::from_secs(180), || {
                Ok(phase(&kube, &ns, "hp", &v)?.is_empty())
            })?;
            f.remove_to_gone.push(t.elapsed());
            eprintln!(
                "run {}: add → Ready {:.1?}, remove → gone {:.1?}",
                i + 1,
                f.add_to_ready[i],
                f.remove_to_gone[i]
            );
        }
        Ok(f)
    })();
    let _ = kube.run(&["delete", "namespace", &ns, "--wait=false"], None);
    let figures = result?;
    let table = table(&figures);
    print!("{table}");
    super::record_table(
        section::HOTPLUG,
        provenance,
        DESCRIPTION,
        &table,
        args.no_docs,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_both_steps_with_their_spread() {
        let s = |v: &[u64]| {
            v.iter()
                .map(|m| Duration::from_millis(*m))
                .collect::<Vec<_>>()
        };
        let t = table(&Figures {
            add_to_ready: s(&[2000, 3000, 4000]),
            remove_to_gone: s(&[1000, 1500, 1200]),
        });
        assert!(t.contains("median (min–max) of 3"), "{t}");
        assert!(t.contains("`addvolume` → volume `Ready`"), "{t}");
    }
}
