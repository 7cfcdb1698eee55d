//! kubectl for the tests that drive the real API server (real_server.rs,
//! console_through_apiserver.rs).

// A failure here is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

use virt_devenv::DevEnv;

/// kubectl for these tests: `$KUBECTL` (`cargo xtask test` exports the cluster's), else the
/// one `cargo xtask cluster up` builds under `target/k8s/<version>/bin/`. Never a guess on
/// PATH: a fresh machine has none, and another version would test something else.
pub fn kubectl_binary() -> PathBuf {
    virt_devenv::kubectl_for_tests().unwrap_or_else(|e| panic!("{e}"))
}

/// Runs kubectl against `env` and returns its stdout; fails the test when kubectl fails.
pub fn kubectl(env: &DevEnv, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let bin = kubectl_binary();
    let mut child = Command::new(&bin)
        .env("KUBECONFIG", &env.kubeconfig)
        .env("HOME", std::env::temp_dir())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
