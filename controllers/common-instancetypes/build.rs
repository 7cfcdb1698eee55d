//! Copies KubeVirt's common-instancetypes bundles out of the `kubevirt.io/kubevirt` Go module
//! that `e2e/virtctl/go.mod` pins (the one whose virtctl the e2e tests drive), so the bundle
//! virt-operator deploys is KubeVirt's own release data, never retyped nor committed here.
//!
//! Where the module is: `$KUBEVIRT_RS_KUBEVIRT_MODULE_DIR` if set (an image build that
//! fetched it elsewhere), else the Go module cache (`$GOMODCACHE`, `$GOPATH/pkg/mod`,
//! `~/go/pkg/mod`), else `go mod download -json kubevirt.io/kubevirt` is run in
//! `e2e/virtctl`, which fetches it from the Go module proxy and checks it against that
//! module's `go.sum`. Without Go and without the module the build stops saying so.

// A build script reports a failure by panicking with what to do: that is its interface.
#![allow(clippy::expect_used)]

use std::path::PathBuf;

use kubevirt_upstream::{MODULE_DIR_ENV, pinned_module_dir};

/// Where KubeVirt's virt-operator embeds the bundles from, inside the module.
const DATA: &str = "pkg/virt-operator/resource/generate/components/data";
const FILES: [&str; 2] = [
    "common-clusterinstancetypes-bundle.yaml",
    "common-clusterpreferences-bundle.yaml",
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest.join("../..");
    println!(
        "cargo:rerun-if-changed={}",
        kubevirt_upstream::pinned_go_mod(&root).display()
    );
    println!("cargo:rerun-if-changed=build.rs");
    for v in [MODULE_DIR_ENV, "GOMODCACHE", "GOPATH"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let (version, dir) = pinned_module_dir(&root, DATA).unwrap_or_else(|e| {
        panic!("KubeVirt's common-instancetypes bundle comes from KubeVirt's Go module: {e}")
    });
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    for f in FILES {
        let src = dir.join(DATA).join(f);
        println!("cargo:rerun-if-changed={}", src.display());
        let data = std::fs::read(&src)
            .unwrap_or_else(|e| panic!("reading {} from KubeVirt's Go module: {e}", src.display()));
        std::fs::write(out.join(f), data).expect("writing the bundle into OUT_DIR");
    }
    println!("cargo:rustc-env=KUBEVIRT_MODULE_VERSION={version}");
}
