//! KubeVirt's PrometheusRule (its recording rules and alerts), as KubeVirt's own code builds
//! it: upstream the rules are Go code (`pkg/monitoring/rules` of `kubevirt.io/kubevirt`), not
//! data, so the only way to take them unchanged is to run that code. `promrules/` is a tiny
//! Go program that does, pinned to the `kubevirt.io/kubevirt` that `e2e/virtctl/go.mod` pins
//! (checked here); its JSON goes into `OUT_DIR` and `render::monitoring` embeds it.
//!
//! `$KUBEVIRT_RS_PROMETHEUS_RULE` names an already generated file instead (an image build whose
//! Rust stage has no Go, images/virt-operator.Dockerfile). Without it and without Go the build
//! stops saying so. The first run compiles KubeVirt's packages (minutes); Go's build cache
//! makes later ones take a second or two, and cargo reruns this only when an input changes.

// A build script reports a failure by panicking with what to do: that is its interface.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use kubevirt_upstream::{MODULE, required_version};
/// The namespace the rules' expressions are written for: KubeVirt builds them for its install
/// namespace, which is `render::NAMESPACE` here (a unit test checks they agree).
const NAMESPACE: &str = "kubevirt";
const OUT_FILE: &str = "prometheus-kubevirt-rules.json";

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let program = manifest.join("promrules");
    let pinned_go_mod = kubevirt_upstream::pinned_go_mod(&manifest.join("../.."));
    for f in [
        pinned_go_mod.clone(),
        program.join("go.mod"),
        program.join("go.sum"),
        program.join("main.go"),
    ] {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=KUBEVIRT_RS_PROMETHEUS_RULE");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join(OUT_FILE);

    let version = |go_mod: &Path| required_version(go_mod).unwrap_or_else(|e| panic!("{e}"));
    let pinned = version(&pinned_go_mod);
    let ours = version(&program.join("go.mod"));
    if pinned != ours {
        panic!(
            "controllers/operator/promrules/go.mod requires {MODULE} {ours} but \
             e2e/virtctl/go.mod pins {pinned}: the rules must come from the KubeVirt the rest \
             of kubevirt-rs follows; update promrules/go.mod (and `go mod tidy` there)"
        );
    }

    let json = match std::env::var("KUBEVIRT_RS_PROMETHEUS_RULE") {
        Ok(path) => {
            println!("cargo:rerun-if-changed={path}");
            std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading KUBEVIRT_RS_PROMETHEUS_RULE={path}: {e}"))
        }
        Err(_) => run_program(&program, &pinned),
    };
    check(&json);
    std::fs::write(&out, json).expect("writing the PrometheusRule into OUT_DIR");
    println!("cargo:rustc-env=KUBEVIRT_RULES_MODULE_VERSION={pinned}");
}

/// `go run . kubevirt` in `promrules/`: KubeVirt's PrometheusRule as JSON.
fn run_program(program: &Path, version: &str) -> String {
    let go = kubevirt_upstream::go().unwrap_or_else(|| {
        panic!(
            "KubeVirt's recording rules and alerts come from running KubeVirt's own Go code \
                 ({MODULE}@{version}, pkg/monitoring/rules) through \
                 controllers/operator/promrules, and Go is not installed: install Go \
                 (https://go.dev/dl/, to /usr/local/go) or set KUBEVIRT_RS_PROMETHEUS_RULE to \
                 the output of `go run . kubevirt` in that directory"
        )
    });
    let output = Command::new(go)
        .args(["run", ".", NAMESPACE])
        .current_dir(program)
        .env("GOTOOLCHAIN", "local")
        // go.sum is committed: a build never rewrites it, nor resolves anything it does not
        // name.
        .env("GOFLAGS", "-mod=readonly")
        // KubeVirt's virt-operator reads this at run time to point the alerts' runbook_url
        // elsewhere; the rules embedded here carry KubeVirt's default, whatever the builder's
        // environment says.
        .env_remove("RUNBOOK_URL_TEMPLATE")
        .output()
        .unwrap_or_else(|e| panic!("running go run in {}: {e}", program.display()));
    if !output.status.success() {
        panic!(
            "go run . {NAMESPACE} (in controllers/operator/promrules) failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    String::from_utf8(output.stdout).expect("the PrometheusRule is UTF-8")
}

/// Fails the build on something that is not KubeVirt's PrometheusRule (a truncated run, a file
/// of something else), before it is embedded.
fn check(json: &str) {
    let v: serde_json::Value = serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("KubeVirt's PrometheusRule is not JSON: {e}"));
    let groups = v["spec"]["groups"].as_array().map_or(0, Vec::len);
    if v["kind"] != "PrometheusRule" || groups == 0 {
        panic!("expected a PrometheusRule with rule groups, got: {json}");
    }
}
