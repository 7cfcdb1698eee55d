//! Golden files of launcher pods. `UPDATE_GOLDEN=1 cargo test -p virt-controllers`
//! rewrites them; review the diff like code.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use kubevirt_api::VirtualMachineInstance;
use serde_json::json;

use super::render::{LauncherConfig, PodRenderError, launcher_pod, memory_overhead_mib};

fn vmi() -> VirtualMachineInstance {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "demo", "namespace": "ns1", "uid": "vmi-uid",
                     "labels": {"app": "demo"}},
        "spec": {
            "domain": {
                "cpu": {"cores": 2},
                "resources": {"requests": {"memory": "1Gi", "cpu": "500m"}},
                "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0",
                    "container": {"image": "localhost/kubevirt-rs/test-guest:latest",
                                  "kernelPath": "/vmlinuz", "initrdPath": "/initramfs.gz"}}}
            },
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "vm", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 10,
            "volumes": [{"name": "root", "containerDisk": {"image": "localhost/kubevirt-rs/test-guest:latest",
                                                          "imagePullPolicy": "Never"}}]
        }
    }))
    .unwrap()
}

fn golden(name: &str, actual: &serde_json::Value) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/vmi/testdata")
        .join(name);
    let text = serde_json::to_string_pretty(actual).unwrap() + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} missing: run with UPDATE_GOLDEN=1", path.display()));
    assert_eq!(text, want, "{name} differs; UPDATE_GOLDEN=1 rewrites it");
}

#[test]
fn launcher_pod_with_kvm() {
    let pod = launcher_pod(&vmi(), &LauncherConfig::default()).unwrap();
    golden(
        "launcher_pod_kvm.json",
        &serde_json::to_value(&pod).unwrap(),
    );
}

#[test]
fn launcher_pod_emulated_has_no_kvm_request() {
    let cfg = LauncherConfig {
        allow_emulation: true,
        ..LauncherConfig::default()
    };
    let pod = launcher_pod(&vmi(), &cfg).unwrap();
    let v = serde_json::to_value(&pod).unwrap();
    golden("launcher_pod_emulated.json", &v);
    assert!(!v.to_string().contains("devices.kubevirt.io/kvm"));
    assert!(!v.to_string().contains("--no-emulation"));
}

#[test]
fn overhead_grows_with_vcpus_and_guest_memory() {
    let cfg = LauncherConfig::default();
    // 160 fixed + 2 vCPUs × 8 + 1Gi/512 = 2Mi
    assert_eq!(memory_overhead_mib(&vmi(), &cfg).unwrap(), 160 + 16 + 2);
}

#[test]
fn unpersisted_or_memoryless_vmis_are_errors() {
    let mut v = vmi();
    v.metadata.uid = None;
    assert!(matches!(
        launcher_pod(&v, &LauncherConfig::default()),
        Err(PodRenderError::NotPersisted(_))
    ));
    let mut v = vmi();
    v.spec.domain.resources = None;
    assert!(matches!(
        launcher_pod(&v, &LauncherConfig::default()),
        Err(PodRenderError::NoMemory(_))
    ));
}
