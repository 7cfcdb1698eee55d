//! virt-handler driving real launchers (real libvirt + QEMU under TCG): lifecycle and
//! conditions, launcher death, handler restart with re-adoption.
//! These live in the launcher crate so that Cargo builds the launcher binary for them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kubevirt_api::{
    VirtualMachineInstance, VirtualMachineInstancePhase as Phase, VirtualMachineInstanceStatus,
};
use serde_json::json;
use tokio::sync::watch;
use virt_handler::{Handler, HandlerConfig};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Prints the launchers' logs of a state directory when a test fails (the directory is
/// a tempdir and goes away with the test).
struct DumpOnPanic(PathBuf);

impl Drop for DumpOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            let log = e.path().join("launcher.log");
            if let Ok(text) = std::fs::read_to_string(&log) {
                eprintln!("--- {} ---\n{text}", log.display());
            }
        }
    }
}

fn guest_dir() -> PathBuf {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests start a private libvirtd in mount and PID namespaces and need root"
    );
    let dir = virt_testguest::default_dir();
    virt_testguest::ensure(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "cannot build the test guest into {} (cargo xtask guest): {e}",
                dir.display()
            )
        })
        .dir
}

/// The namespace of this run's VMIs: the launcher names a domain `<namespace>_<name>`
/// and QEMU's command line carries it, so a per-process namespace keeps the "no QEMU
/// left behind" checks from seeing another run's guests on the same host.
fn ns() -> String {
    format!("handler-{}", std::process::id())
}

fn vmi(name: &str) -> VirtualMachineInstance {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": ns()},
        "spec": {
            "terminationGracePeriodSeconds": 20,
            "domain": {
                "resources": {"requests": {"memory": "256Mi"}},
                "firmware": {"kernelBoot": {
                    "kernelArgs": virt_testguest::KERNEL_ARGS,
                    "container": {"image": "guest:latest", "kernelPath": "/vmlinuz", "initrdPath": "/initramfs.gz"}
                }}
            }
        }
    }))
    .unwrap()
}

fn handler_config(state: &std::path::Path) -> HandlerConfig {
    HandlerConfig {
        state_dir: state.to_path_buf(),
        launcher_bin: env!("CARGO_BIN_EXE_virt-launcher").into(),
        launcher_args: vec![
            "--image-dir".into(),
            format!("guest:latest={}", guest_dir().display()),
        ],
    }
}

fn handler(state: &std::path::Path) -> Handler {
    Handler::new(handler_config(state))
}

async fn wait_for(
    rx: &mut watch::Receiver<VirtualMachineInstanceStatus>,
    what: &str,
    pred: impl Fn(&VirtualMachineInstanceStatus) -> bool,
) -> VirtualMachineInstanceStatus {
    let r = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let s = rx.borrow_and_update().clone();
            if pred(&s) {
                return s;
            }
            if rx.changed().await.is_err() {
                return rx.borrow().clone();
            }
        }
    })
    .await;
    match r {
        Ok(s) if pred(&s) => s,
        _ => panic!("VMI never reached {what}; last status: {:?}", rx.borrow()),
    }
}

fn cond(s: &VirtualMachineInstanceStatus, t: &str) -> Option<kubevirt_api::ConditionStatus> {
    s.condition(t).map(|c| c.status)
}

/// PIDs of live QEMU processes of `domain`.
fn qemu_pids(domain: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains("qemu-system")
            && cmd.contains(&format!("guest={domain},"))
            && virt_handler::pid_alive(pid)
        {
            out.push(pid);
        }
    }
    out
}

async fn assert_no_qemu(domain: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !qemu_pids(domain).is_empty() {
        assert!(Instant::now() < deadline, "QEMU of {domain} left behind");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_drives_the_launcher_lifecycle() {
    let _g = SERIAL.lock().await;
    let state = tempfile::tempdir().unwrap();
    let _logs = DumpOnPanic(state.path().to_path_buf());
    let h = handler(state.path());
    let key = h.start(&vmi("life")).await.unwrap();
    let mut rx = h.subscribe(&key).unwrap();
    let s = wait_for(&mut rx, "Running", |s| s.phase == Phase::Running).await;
    assert_eq!(cond(&s, "Ready"), Some(kubevirt_api::ConditionStatus::True));
    assert_eq!(
        cond(&s, "SoftwareEmulation"),
        Some(kubevirt_api::ConditionStatus::True)
    );
    assert!(
        s.runtime_versions
            .as_ref()
            .and_then(|v| v.qemu.as_ref())
            .is_some()
    );

    h.pause(&key).await.unwrap();
    let s = wait_for(&mut rx, "Paused", |s| {
        cond(s, "Paused") == Some(kubevirt_api::ConditionStatus::True)
    })
    .await;
    assert_eq!(
        cond(&s, "Ready"),
        Some(kubevirt_api::ConditionStatus::False)
    );
    h.unpause(&key).await.unwrap();
    wait_for(&mut rx, "unpaused", |s| {
        cond(s, "Paused").is_none() && s.phase == Phase::Running
    })
    .await;

    h.shutdown(&key).await.unwrap();
    wait_for(&mut rx, "Succeeded", |s| s.phase == Phase::Succeeded).await;
    assert_no_qemu(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_launcher_turns_the_vmi_failed() {
    let _g = SERIAL.lock().await;
    let state = tempfile::tempdir().unwrap();
    let _logs = DumpOnPanic(state.path().to_path_buf());
    let h = handler(state.path());
    let key = h.start(&vmi("victim")).await.unwrap();
    let mut rx = h.subscribe(&key).unwrap();
    wait_for(&mut rx, "Running", |s| s.phase == Phase::Running).await;
    let dir = h.dir(&key).unwrap();
    let pid: i32 = std::fs::read_to_string(dir.join("launcher.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let s = wait_for(&mut rx, "Failed", |s| s.phase == Phase::Failed).await;
    let reason = s.reason.unwrap_or_default();
    assert!(
        reason.contains("LauncherDied") && reason.contains("signal 9"),
        "reason: {reason}"
    );
    // Its libvirtd and QEMU die with it (parent-death signal + PID namespace).
    assert_no_qemu(&key).await;
    assert!(
        !dir.join("work").exists(),
        "the dead launcher's work directory was not removed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_handler_readopts_the_running_guest() {
    let _g = SERIAL.lock().await;
    let state = tempfile::tempdir().unwrap();
    let _logs = DumpOnPanic(state.path().to_path_buf());
    let h = handler(state.path());
    let key = h.start(&vmi("survivor")).await.unwrap();
    let mut rx = h.subscribe(&key).unwrap();
    wait_for(&mut rx, "Running", |s| s.phase == Phase::Running).await;
    let qemu_before = qemu_pids(&key);
    assert_eq!(qemu_before.len(), 1);
    // A handler restart: everything in memory is lost, launchers keep running.
    h.detach();
    drop(h);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let h2 = handler(state.path());
    let adopted = h2.adopt().await.unwrap();
    assert_eq!(adopted, vec![key.clone()]);
    let mut rx = h2.subscribe(&key).unwrap();
    wait_for(&mut rx, "Running after re-adoption", |s| {
        s.phase == Phase::Running
    })
    .await;
    assert_eq!(
        qemu_pids(&key),
        qemu_before,
        "the guest must not be restarted"
    );
    // The re-adopted launcher is fully controllable.
    h2.pause(&key).await.unwrap();
    wait_for(&mut rx, "Paused", |s| {
        cond(s, "Paused") == Some(kubevirt_api::ConditionStatus::True)
    })
    .await;
    h2.unpause(&key).await.unwrap();
    h2.shutdown(&key).await.unwrap();
    wait_for(&mut rx, "Succeeded", |s| s.phase == Phase::Succeeded).await;
    // Not our child any more: wait for the launcher to exit on its own.
    let pid: u32 = std::fs::read_to_string(state.path().join(&key).join("launcher.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while virt_handler::pid_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "launcher did not exit after shutdown"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_no_qemu(&key).await;
}

fn spawn_handler_process(
    state: &std::path::Path,
    vmi: Option<&std::path::Path>,
) -> std::process::Child {
    // A standalone virt-handler in its own process (test-helpers/handler_child.rs), so
    // that a test can `kill -9` a real handler process and start another.
    let config = handler_config(state);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_test-handler-child"));
    cmd.arg("standalone")
        .env("HANDLER_CHILD_STATE", state)
        .env("HANDLER_LAUNCHER", &config.launcher_bin)
        .env("HANDLER_LAUNCHER_ARGS", config.launcher_args.join("\n"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if let Some(v) = vmi {
        cmd.env("HANDLER_CHILD_VMI", v);
    }
    cmd.spawn().unwrap()
}

async fn wait_for_file_status(
    file: &std::path::Path,
    what: &str,
    pred: impl Fn(&VirtualMachineInstanceStatus) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(b) = std::fs::read(file)
            && let Ok(s) = serde_json::from_slice::<VirtualMachineInstanceStatus>(&b)
            && pred(&s)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never written to {}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_handler_process_loses_no_vm() {
    let _g = SERIAL.lock().await;
    let state = tempfile::tempdir().unwrap();
    let _logs = DumpOnPanic(state.path().to_path_buf());
    let vmi_file = state.path().join("input.json");
    std::fs::write(&vmi_file, serde_json::to_vec(&vmi("orphan")).unwrap()).unwrap();
    let key = &format!("{}_orphan", ns());
    let status_file = state.path().join(key).join("status.json");

    let mut first = spawn_handler_process(state.path(), Some(&vmi_file));
    wait_for_file_status(&status_file, "Running", |s| s.phase == Phase::Running).await;
    let qemu = qemu_pids(key);
    assert_eq!(qemu.len(), 1);
    first.kill().unwrap();
    first.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(qemu_pids(key), qemu, "the guest must survive its handler");

    // A new handler process re-adopts the launcher: proven by it noticing the launcher's death.
    let mut second = spawn_handler_process(state.path(), None);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let launcher: i32 = std::fs::read_to_string(state.path().join(key).join("launcher.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(launcher),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for_file_status(&status_file, "Failed", |s| {
        s.phase == Phase::Failed
            && s.reason
                .as_deref()
                .is_some_and(|r| r.contains("LauncherDied"))
    })
    .await;
    second.kill().unwrap();
    second.wait().unwrap();
    assert_no_qemu(key).await;
}
