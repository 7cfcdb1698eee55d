//! The real plugin binary against a real virt-apiserver and etcd: actions reach the
//! subresources and change the VM as KubeVirt's virtctl would; errors name what to fix.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::kubectl;

use std::path::PathBuf;
use std::process::Command;

use virt_devenv::{DevEnv, Options};

/// virt-apiserver is a workspace binary: `cargo test --workspace` builds it next to us.
fn apiserver_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("VIRT_APISERVER_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir.join("virt-apiserver");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build -p virt-apiserver` first",
        bin.display()
    );
    bin
}

fn start_env() -> DevEnv {
    DevEnv::start(Options {
        apiserver_bin: apiserver_bin(),
        ..Default::default()
    })
    .unwrap()
}

fn plugin(env: &DevEnv, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-virt"))
        .env("KUBECONFIG", &env.kubeconfig)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn plugin_drives_the_real_api_server() {
    let env = start_env();

    // `create vm` output applies unchanged.
    let (code, yaml, err) = plugin(
        &env,
        &[
            "create",
            "vm",
            "--name",
            "demo",
            "--run-strategy",
            "Halted",
            "--memory",
            "64Mi",
            "--volume-containerdisk",
            "src:localhost/kubevirt-rs/test-guest:latest",
        ],
    );
    assert_eq!(code, 0, "{err}");
    kubectl(&env, &["apply", "-f", "-"], Some(&yaml));
    let strategy = |env: &DevEnv| {
        kubectl(
            env,
            &["get", "vm", "demo", "-o", "jsonpath={.spec.runStrategy}"],
            None,
        )
    };
    assert_eq!(strategy(&env), "Halted");

    let (code, _, err) = plugin(&env, &["start", "demo"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(strategy(&env), "Always");
    let (code, _, err) = plugin(&env, &["stop", "demo"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(strategy(&env), "Halted");

    // A second stop is refused with the server's reason, exit 1.
    let (code, _, err) = plugin(&env, &["stop", "demo"]);
    assert_eq!(code, 1);
    assert!(err.contains("VM is not running"), "{err}");

    // Missing VM: say which namespace was searched.
    let (code, _, err) = plugin(&env, &["-n", "elsewhere", "start", "demo"]);
    assert_eq!(code, 1);
    assert!(err.contains("demo") && err.contains("elsewhere"), "{err}");

    // Console of a VM that has no running instance: a clear message, not a hang.
    let (code, _, err) = plugin(&env, &["console", "demo", "--timeout", "0"]);
    assert_eq!(code, 1, "{err}");
    assert!(!err.is_empty());
}

/// `adm backup` writes a complete file and `adm restore` brings a deleted VM back with its
/// uid; a file that is no backup is refused naming the file, before any request.
#[test]
fn plugin_backs_up_and_restores() {
    let env = start_env();
    let (code, yaml, err) = plugin(
        &env,
        &["create", "vm", "--name", "keep", "--run-strategy", "Halted"],
    );
    assert_eq!(code, 0, "{err}");
    kubectl(&env, &["apply", "-f", "-"], Some(&yaml));
    let uid = kubectl(
        &env,
        &["get", "vm", "keep", "-o", "jsonpath={.metadata.uid}"],
        None,
    );

    let file = env.dir().join("backup.json");
    let file_arg = file.to_str().unwrap();
    let (code, out, err) = plugin(&env, &["adm", "backup", "--to", file_arg]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("Backed up 1 objects"), "{out}");
    assert!(!env.dir().join("backup.json.partial").exists());
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode, 0o600,
            "the backup file is readable by others: {mode:o}"
        );
    }

    kubectl(&env, &["delete", "vm", "keep"], None);
    let (code, out, err) = plugin(&env, &["adm", "restore", "--from", file_arg]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("1 created, 0 updated, 0 deleted, 0 unchanged"),
        "{out}"
    );
    let back = kubectl(
        &env,
        &["get", "vm", "keep", "-o", "jsonpath={.metadata.uid}"],
        None,
    );
    assert_eq!(back, uid);

    let not_backup = env.dir().join("vm.yaml");
    std::fs::write(&not_backup, "{\"kind\": \"VirtualMachine\"}").unwrap();
    let (code, _, err) = plugin(
        &env,
        &["adm", "restore", "--from", not_backup.to_str().unwrap()],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("vm.yaml is not a backup") && err.contains("VirtualMachine"),
        "{err}"
    );
}
