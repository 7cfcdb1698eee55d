//! A VM really runs on the cluster: virt-controller creates the VMI and its launcher pod, the
//! launcher boots the test guest (kernelBoot from `localhost/kubevirt-rs/test-guest:latest`,
//! TCG), virt-handler reports it Running, and the console goes kubectl → kube-apiserver →
//! virt-apiserver → virt-handler → the guest's serial port. Lifecycle through `kubectl virt`
//! (stop, start, restart, pause, unpause), runStrategy Halted, deletion.
//!
//! Needs root and the packages of docs/local-cluster.md and docs/deploy.md. Uses the cluster
//! named by KUBECONFIG (images loaded with E2E_IMAGE_LOAD) or brings the local one up. Run with
//! `cargo test -p e2e -- --ignored` (`cargo xtask test` does).

// The helpers below serve only these tests: a failure is a test failure.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use e2e::Cluster;

/// How long a VM may take to boot: image copy, a cold QEMU capabilities probe (~10 s once per
/// node), TCG boot of the tiny guest, on a machine shared with builds.
const BOOT: Duration = Duration::from_secs(240);
/// Deletions: the launcher's ACPI shutdown waits out the VMI's grace period (5 s below).
const GONE: Duration = Duration::from_secs(120);
const TEST_GUEST: &str = "localhost/kubevirt-rs/test-guest:latest";

fn cluster() -> &'static Cluster {
    Cluster::with_kubevirt().expect("cluster with kubevirt-rs deployed")
}

/// A namespace of its own per test, deleted at the end (without waiting).
struct Ns<'a> {
    c: &'a Cluster,
    name: String,
}

impl<'a> Ns<'a> {
    fn new(c: &'a Cluster, prefix: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let name = format!("e2e-{prefix}-{}-{nanos:x}", std::process::id());
        c.kubectl(&["create", "namespace", &name])
            .expect("namespace");
        Ns { c, name }
    }

    fn k(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        self.c.kubectl(&a)
    }

    /// `kubectl virt ARGS` in this namespace (the plugin on PATH).
    fn virt(&self, args: &[&str]) -> String {
        // kubectl takes no flags before a plugin's name: KUBECONFIG, and -n after it.
        let out = Command::new(kubectl_binary())
            .env("PATH", plugin_path())
            .env("KUBECONFIG", &self.c.kubeconfig)
            .arg("virt")
            .args(args)
            .args(["-n", &self.name])
            .output()
            .expect("running kubectl virt");
        assert!(
            out.status.success(),
            "kubectl virt {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn apply_vm(&self, name: &str, run_strategy: &str) {
        self.c
            .kubectl_stdin(
                &["apply", "-f", "-"],
                Some(&vm_manifest(name, &self.name, run_strategy)),
            )
            .expect("apply VM");
    }

    /// A jsonpath of an object, empty when it does not exist.
    fn get(&self, kind: &str, name: &str, jsonpath: &str) -> String {
        self.k(&[
            "get",
            kind,
            name,
            "--ignore-not-found",
            "-o",
            &format!("jsonpath={jsonpath}"),
        ])
        .unwrap_or_default()
    }

    fn vmi_phase(&self, name: &str) -> String {
        self.get("vmi", name, "{.status.phase}")
    }

    fn vmi_uid(&self, name: &str) -> String {
        self.get("vmi", name, "{.metadata.uid}")
    }

    fn vm_status(&self, name: &str) -> String {
        self.get("vm", name, "{.status.printableStatus}")
    }

    fn launcher_pods(&self, vm: &str) -> Vec<String> {
        self.k(&[
            "get",
            "pods",
            "-l",
            &format!("kubevirt.io=virt-launcher,vm.kubevirt.io/name={vm}"),
            "-o",
            "name",
        ])
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
    }

    /// What the cluster says about a VM that did not get where it should: for the failure message.
    fn diagnose(&self, vm: &str) -> String {
        let mut out = String::new();
        for args in [
            vec!["get", "vm,vmi,pods", "-o", "wide"],
            vec!["get", "vmi", vm, "-o", "yaml"],
            vec!["describe", "pods"],
            vec![
                "logs",
                "-l",
                "kubevirt.io=virt-launcher",
                "--all-containers",
                "--tail=40",
            ],
            vec!["get", "events", "--sort-by=.lastTimestamp"],
        ] {
            match self.k(&args) {
                Ok(s) => out.push_str(&s),
                Err(e) => out.push_str(&format!("{e:#}\n")),
            }
        }
        for args in [
            [
                "-n",
                "kubevirt",
                "logs",
                "deployment/virt-controller",
                "--tail=30",
            ],
            [
                "-n",
                "kubevirt",
                "logs",
                "daemonset/virt-handler",
                "--tail=30",
            ],
        ] {
            match self.c.kubectl(&args) {
                Ok(s) => out.push_str(&s),
                Err(e) => out.push_str(&format!("{e:#}\n")),
            }
        }
        out
    }

    fn wait(&self, vm: &str, what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
        if let Err(e) = self.c.eventually(what, timeout, || Ok(f())) {
            panic!("{e:#}\n{}", self.diagnose(vm));
        }
    }

    fn wait_running(&self, vm: &str) {
        self.wait(vm, &format!("VMI {vm} Running"), BOOT, || {
            self.vmi_phase(vm) == "Running"
        });
    }

    /// VMI and launcher pod gone, VM status Stopped.
    fn wait_stopped(&self, vm: &str) {
        self.wait(vm, &format!("VM {vm} stopped"), GONE, || {
            self.vmi_uid(vm).is_empty()
                && self.launcher_pods(vm).is_empty()
                && self.vm_status(vm) == "Stopped"
        });
    }
}

impl Drop for Ns<'_> {
    fn drop(&mut self) {
        let _ = self
            .c
            .kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

fn vm_manifest(name: &str, ns: &str, run_strategy: &str) -> String {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "e2e"}},
        "spec": {
            "runStrategy": run_strategy,
            "template": {"spec": {
                // The busybox guest ignores the ACPI button: a short grace keeps stops quick.
                "terminationGracePeriodSeconds": 5,
                "domain": {
                    "memory": {"guest": "128Mi"},
                    "devices": {},
                    "firmware": {"kernelBoot": {
                        "kernelArgs": virt_testguest::KERNEL_ARGS,
                        "container": {
                            "image": TEST_GUEST,
                            "imagePullPolicy": "IfNotPresent",
                            "kernelPath": "/vmlinuz",
                            "initrdPath": "/initramfs.gz"
                        }
                    }}
                }
            }}
        }
    })
    .to_string()
}

fn workspace_target() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => e2e::workspace_root().join(t),
        None => e2e::workspace_root().join("target"),
    }
}

fn kubectl_binary() -> PathBuf {
    std::fs::read_dir(workspace_target().join("k8s"))
        .ok()
        .and_then(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin/kubectl"))
                .find(|p| p.exists())
        })
        .unwrap_or_else(|| PathBuf::from("kubectl"))
}

/// PATH with the freshly built `kubectl-virt` first (built once per test binary).
fn plugin_path() -> String {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "kubectl-virt", "--bin", "kubectl-virt"])
            .current_dir(e2e::workspace_root())
            .status()
            .expect("cargo build -p kubectl-virt");
        assert!(status.success(), "cargo build -p kubectl-virt failed");
    });
    format!(
        "{}:{}",
        workspace_target().join("debug").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// `kubectl virt console` in a detached tmux session: keys in, screen out.
struct Console {
    session: String,
}

impl Console {
    fn open(ns: &Ns<'_>, vmi: &str) -> Console {
        let session = format!("e2e-console-{}-{vmi}", std::process::id());
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &session])
            .output();
        let cmd = format!(
            "exec env PATH='{}' KUBECONFIG='{}' '{}' virt console '{vmi}' -n '{}'",
            plugin_path(),
            ns.c.kubeconfig.display(),
            kubectl_binary().display(),
            ns.name,
        );
        let out = Command::new("tmux")
            .args(["new-session", "-d", "-x", "160", "-y", "50", "-s", &session])
            .arg(cmd)
            .output()
            .expect("tmux (apt-get install tmux)");
        assert!(
            out.status.success(),
            "tmux: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Keep the pane after the plugin exits, to see that it did.
        let _ = Command::new("tmux")
            .args(["set-option", "-t", &session, "remain-on-exit", "on"])
            .output();
        Console { session }
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args([
                "capture-pane",
                "-p",
                "-J",
                "-S",
                "-200",
                "-t",
                &self.session,
            ])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types text (literally) and Enter.
    fn line(&self, text: &str) {
        let ok = Command::new("tmux")
            .args(["send-keys", "-t", &self.session, "-l", text])
            .status()
            .expect("tmux send-keys")
            .success()
            && Command::new("tmux")
                .args(["send-keys", "-t", &self.session, "Enter"])
                .status()
                .expect("tmux send-keys")
                .success();
        assert!(ok, "tmux send-keys failed");
    }

    fn key(&self, key: &str) {
        assert!(
            Command::new("tmux")
                .args(["send-keys", "-t", &self.session, key])
                .status()
                .expect("tmux send-keys")
                .success()
        );
    }

    fn exited(&self) -> bool {
        Command::new("tmux")
            .args(["list-panes", "-t", &self.session, "-F", "#{pane_dead}"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "1")
    }

    /// Waits until the screen shows `text`.
    fn expect(&self, ns: &Ns<'_>, vm: &str, text: &str, timeout: Duration) {
        if let Err(e) =
            ns.c.eventually(&format!("console showing {text:?}"), timeout, || {
                Ok(self.screen().contains(text))
            })
        {
            panic!("{e:#}\nscreen:\n{}\n{}", self.screen(), ns.diagnose(vm));
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.session])
            .output();
    }
}

/// Runs `echo $((a*b))` in the guest and waits for the product on its own line.
fn compute(console: &Console, ns: &Ns<'_>, vm: &str, a: u32, b: u32) {
    console.line(&format!("echo $(({a}*{b}))"));
    let want = format!("\n{}", a * b);
    if let Err(e) =
        ns.c.eventually("the guest's answer", Duration::from_secs(60), || {
            Ok(console.screen().contains(&want))
        })
    {
        panic!("{e:#}\nscreen:\n{}\n{}", console.screen(), ns.diagnose(vm));
    }
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn vm_always_boots_and_its_console_answers() {
    let c = cluster();
    let ns = Ns::new(c, "boot");
    ns.apply_vm("boot", "Always");
    ns.wait_running("boot");
    // The launcher pod is the VMI's, on the node the VMI names.
    let node = ns.get("vmi", "boot", "{.status.nodeName}");
    assert!(!node.is_empty(), "Running VMI without nodeName");
    let pods = ns.launcher_pods("boot");
    assert_eq!(pods.len(), 1, "{pods:?}");
    assert_eq!(ns.vm_status("boot").trim(), "Running");

    let console = Console::open(&ns, "boot");
    // The banner may have scrolled past before we connected: Enter brings a fresh prompt.
    console.line("");
    console.expect(&ns, "boot", virt_testguest::PROMPT.trim(), BOOT);
    compute(&console, &ns, "boot", 6, 7);
    // Ctrl+] leaves the console; the VM keeps running.
    console.key("C-]");
    ns.wait(
        "boot",
        "kubectl virt console to exit on Ctrl+]",
        Duration::from_secs(30),
        || console.exited(),
    );
    assert_eq!(ns.vmi_phase("boot"), "Running");
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn banner_on_the_console_from_the_first_boot() {
    let c = cluster();
    let ns = Ns::new(c, "banner");
    // Halted first, so that the console is attached before the guest prints anything.
    ns.apply_vm("banner", "Halted");
    ns.wait("banner", "VM banner Stopped", GONE, || {
        ns.vm_status("banner") == "Stopped"
    });
    ns.virt(&["start", "banner"]);
    // The plugin waits for the VMI to run, then attaches.
    let console = Console::open(&ns, "banner");
    ns.wait_running("banner");
    console.expect(&ns, "banner", virt_testguest::BANNER, BOOT);
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn stop_start_restart_through_the_plugin() {
    let c = cluster();
    let ns = Ns::new(c, "life");
    ns.apply_vm("life", "Always");
    ns.wait_running("life");

    ns.virt(&["stop", "life"]);
    ns.wait_stopped("life");

    ns.virt(&["start", "life"]);
    ns.wait_running("life");
    let before = ns.vmi_uid("life");
    assert!(!before.is_empty());

    ns.virt(&["restart", "life"]);
    ns.wait("life", "a new VMI Running after restart", BOOT, || {
        let uid = ns.vmi_uid("life");
        !uid.is_empty() && uid != before && ns.vmi_phase("life") == "Running"
    });
    ns.wait("life", "the old launcher pod gone", GONE, || {
        ns.launcher_pods("life").len() == 1
    });
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn halted_vm_never_starts() {
    let c = cluster();
    let ns = Ns::new(c, "halted");
    ns.apply_vm("halted", "Halted");
    // Once the controller has written the VM's status it has decided: nothing to run.
    ns.wait("halted", "VM halted Stopped", GONE, || {
        ns.vm_status("halted") == "Stopped"
    });
    assert_eq!(ns.vmi_uid("halted"), "");
    assert!(ns.launcher_pods("halted").is_empty());
    // A spec change is another chance for a wrong decision.
    ns.k(&["label", "vm", "halted", "touched=yes"])
        .expect("label");
    ns.wait(
        "halted",
        "VM halted relabelled and still Stopped",
        GONE,
        || {
            ns.get("vm", "halted", "{.metadata.labels.touched}") == "yes"
                && ns.vm_status("halted") == "Stopped"
        },
    );
    assert_eq!(ns.vmi_uid("halted"), "");
    assert!(ns.launcher_pods("halted").is_empty());
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn deleting_the_vm_deletes_its_vmi_and_pod() {
    let c = cluster();
    let ns = Ns::new(c, "delete");
    ns.apply_vm("gone", "Always");
    ns.wait_running("gone");
    assert_eq!(ns.launcher_pods("gone").len(), 1);
    ns.k(&["delete", "vm", "gone", "--wait=false"])
        .expect("delete vm");
    ns.wait("gone", "VM, VMI and launcher pod gone", GONE, || {
        ns.get("vm", "gone", "{.metadata.name}").is_empty()
            && ns.vmi_uid("gone").is_empty()
            && ns.launcher_pods("gone").is_empty()
    });
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn console_survives_90_seconds_idle() {
    let c = cluster();
    let ns = Ns::new(c, "idle");
    ns.apply_vm("idle", "Always");
    ns.wait_running("idle");
    let console = Console::open(&ns, "idle");
    console.line("");
    console.expect(&ns, "idle", virt_testguest::PROMPT.trim(), BOOT);
    compute(&console, &ns, "idle", 6, 7);
    // Longer than any proxy's idle timeout we know of (kube-apiserver, virt-apiserver,
    // virt-handler): the pings must keep every hop open.
    std::thread::sleep(Duration::from_secs(90));
    assert!(
        !console.exited(),
        "console closed while idle:\n{}",
        console.screen()
    );
    compute(&console, &ns, "idle", 7, 191);
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn pause_and_unpause_show_in_kubectl_get_vm() {
    let c = cluster();
    let ns = Ns::new(c, "pause");
    ns.apply_vm("pause", "Always");
    ns.wait_running("pause");

    ns.virt(&["pause", "vm", "pause"]);
    ns.wait("pause", "VM pause Paused", BOOT, || {
        ns.vm_status("pause") == "Paused"
    });
    let printed = ns.k(&["get", "vm", "pause"]).expect("get vm");
    assert!(printed.contains("Paused"), "{printed}");
    let paused = ns.get(
        "vmi",
        "pause",
        r#"{.status.conditions[?(@.type=="Paused")].status}"#,
    );
    assert_eq!(paused, "True");

    ns.virt(&["unpause", "vm", "pause"]);
    ns.wait("pause", "VM pause Running again", BOOT, || {
        ns.vm_status("pause") == "Running"
    });
    let printed = ns.k(&["get", "vm", "pause"]).expect("get vm");
    assert!(printed.contains("Running"), "{printed}");
    // The guest runs again: its console answers.
    let console = Console::open(&ns, "pause");
    console.line("");
    console.expect(&ns, "pause", virt_testguest::PROMPT.trim(), BOOT);
    compute(&console, &ns, "pause", 6, 7);
}
