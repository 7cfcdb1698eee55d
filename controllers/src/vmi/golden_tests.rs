//! Golden files of launcher pods. `UPDATE_GOLDEN=1 cargo test -p virt-controllers`
//! rewrites them; review the diff like code.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use kubevirt_api::VirtualMachineInstance;
use serde_json::json;

use super::render::{
    CONSOLE_LOG_CONTAINER, COPY_FN, ImageCopy, LauncherConfig, PodRenderError, copier_script_with,
    copy_script, hostname_of, image_copies, launcher_pod, memory_overhead_mib,
};

fn vmi() -> VirtualMachineInstance {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "demo", "namespace": "ns1", "uid": "vmi-uid",
                     "labels": {"app": "demo"}},
        "spec": {
            "domain": {
                "cpu": {"cores": 2},
                "resources": {"requests": {"memory": "1Gi", "cpu": "500m"}},
                "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}},
                                      {"name": "data", "disk": {"bus": "virtio"}}]},
                "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0",
                    "container": {"image": "localhost/kubevirt-rs/test-guest:latest",
                                  "kernelPath": "/vmlinuz", "initrdPath": "/initramfs.gz"}}}
            },
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "vm", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 10,
            "volumes": [{"name": "root", "containerDisk": {"image": "localhost/kubevirt-rs/test-guest:latest",
                                                          "imagePullPolicy": "Never"}},
                        {"name": "data", "containerDisk": {"image": "example.org/disks/data:v1",
                                                          "path": "/images/data.qcow2",
                                                          "imagePullSecret": "registry-creds"}}]
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

#[test]
fn one_copier_per_image_with_exactly_the_files_used() {
    let copies = image_copies(&vmi()).unwrap();
    assert_eq!(
        copies,
        vec![
            ImageCopy {
                image: "localhost/kubevirt-rs/test-guest:latest".into(),
                pull_policy: Some("Never".into()),
                files: vec!["/disk".into(), "/vmlinuz".into(), "/initramfs.gz".into()],
            },
            ImageCopy {
                image: "example.org/disks/data:v1".into(),
                pull_policy: None,
                files: vec!["/images/data.qcow2".into()],
            },
        ]
    );
    assert_eq!(
        copy_script(&copies[1], "/var/run/kubevirt-rs/images/1"),
        format!(
            "{COPY_FN}; mkdir -p '/var/run/kubevirt-rs/images/1' '/var/run/kubevirt-rs/images/1/images' \
             && copy '/images/data.qcow2' '/var/run/kubevirt-rs/images/1/images/data.qcow2'"
        )
    );
}

/// A copier container run for real (the host's sh, as busybox's in the pod): it copies,
/// leaves `DIR.done`, lives while the launcher holds its lifeline and ends when the
/// launcher does; a failed copy leaves `DIR.failed` with the message; a launcher that
/// already ended in an orderly way is not waited for.
#[test]
fn image_copier_lives_as_long_as_the_launcher() {
    use std::time::{Duration, Instant};
    let root = tempfile::tempdir().unwrap();
    let src = root.path().join("img");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("vmlinuz"), b"kernel").unwrap();
    let life = root.path().join("life");
    let ended = root.path().join("ended");
    let spawn = |file: &str, dir: &str| {
        let copy = ImageCopy {
            image: "i".into(),
            pull_policy: None,
            files: vec![format!("{}/{file}", src.display())],
        };
        let dir = root.path().join(dir).display().to_string();
        std::process::Command::new("sh")
            .arg("-c")
            .arg(copier_script_with(
                &copy,
                &dir,
                &life.display().to_string(),
                &ended.display().to_string(),
            ))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let wait_exit = |c: &mut std::process::Child, within: Duration| {
        let t = Instant::now();
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return Some(s);
            }
            if t.elapsed() > within {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let until = |p: &std::path::Path| {
        let t = Instant::now();
        while !p.exists() {
            assert!(t.elapsed() < Duration::from_secs(10), "{}", p.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    // The launcher holds its lifeline (a FIFO opened read-write, as virt-launcher does).
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&life)
            .status()
            .unwrap()
            .success()
    );
    let launcher = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&life)
        .unwrap();
    let mut copier = spawn("vmlinuz", "0");
    until(&root.path().join("0.done"));
    let copied = root.path().join("0").join(src.strip_prefix("/").unwrap());
    assert_eq!(std::fs::read(copied.join("vmlinuz")).unwrap(), b"kernel");
    assert!(
        wait_exit(&mut copier, Duration::from_millis(1500)).is_none(),
        "the copier must live while the launcher does"
    );
    drop(launcher);
    let status = wait_exit(&mut copier, Duration::from_secs(5)).expect("ends with the launcher");
    assert!(status.success());

    // A failed copy: DIR.failed names the file, the copier fails.
    let mut failing = spawn("missing", "1");
    let status = wait_exit(&mut failing, Duration::from_secs(5)).expect("a failed copy ends");
    assert!(!status.success());
    let message = std::fs::read_to_string(root.path().join("1.failed")).unwrap();
    assert!(message.contains("missing"), "{message}");
    assert!(!root.path().join("1.done").exists());

    // The launcher ended (orderly) before the copier reached its lifeline.
    std::fs::write(&ended, b"").unwrap();
    let mut late = spawn("vmlinuz", "2");
    let status = wait_exit(&mut late, Duration::from_secs(5)).expect("no launcher to wait for");
    assert!(status.success());
    assert!(root.path().join("2.done").exists());
}

/// The copier run for real (the host's sh and find, as busybox's in the pod): regular
/// files and directories are copied, a symbolic link or FIFO anywhere in what is copied
/// fails the copy with a message naming it, and nothing of it is copied.
#[test]
fn image_copier_takes_regular_files_only() {
    let root = tempfile::tempdir().unwrap();
    let src = root.path().join("img");
    std::fs::create_dir_all(src.join("disk")).unwrap();
    std::fs::write(src.join("disk/a.img"), b"data").unwrap();
    std::fs::write(src.join("vmlinuz"), b"kernel").unwrap();
    let run = |files: &[&str]| {
        let copy = ImageCopy {
            image: "i".into(),
            pull_policy: None,
            files: files
                .iter()
                .map(|f| format!("{}{f}", src.display()))
                .collect(),
        };
        let dest = root.path().join("out");
        let _ = std::fs::remove_dir_all(&dest);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(copy_script(&copy, &dest.display().to_string()))
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
            dest,
        )
    };
    let (ok, err, dest) = run(&["/disk", "/vmlinuz"]);
    assert!(ok, "{err}");
    let copied = dest.join(src.strip_prefix("/").unwrap());
    assert_eq!(std::fs::read(copied.join("disk/a.img")).unwrap(), b"data");
    assert!(
        std::fs::symlink_metadata(copied.join("vmlinuz"))
            .unwrap()
            .is_file()
    );

    std::os::unix::fs::symlink("/etc/shadow", src.join("disk/b.img")).unwrap();
    let (ok, err, dest) = run(&["/disk"]);
    assert!(!ok);
    assert!(
        err.contains("disk/b.img in the image is not a regular file"),
        "{err}"
    );
    assert!(
        !dest
            .join(src.strip_prefix("/").unwrap())
            .join("disk")
            .exists()
    );

    std::os::unix::fs::symlink("/dev/sda", src.join("kernel")).unwrap();
    let (ok, err, _) = run(&["/kernel"]);
    assert!(!ok);
    assert!(
        err.contains("/kernel in the image is not a regular file"),
        "{err}"
    );

    assert!(
        std::process::Command::new("mkfifo")
            .arg(src.join("fifo"))
            .status()
            .unwrap()
            .success()
    );
    let (ok, err, _) = run(&["/fifo"]);
    assert!(!ok && err.contains("/fifo in the image"), "{err}");
}

#[test]
fn image_paths_are_quoted_and_may_not_leave_the_image() {
    let c = ImageCopy {
        image: "i".into(),
        pull_policy: None,
        files: vec!["/it's here/d.img".into()],
    };
    assert_eq!(
        copy_script(&c, "/x"),
        format!(
            r"{COPY_FN}; mkdir -p '/x' '/x/it'\''s here' && copy '/it'\''s here/d.img' '/x/it'\''s here/d.img'"
        )
    );
    for bad in ["../etc/shadow", "/disk/../../etc", "/", ""] {
        let mut v = vmi();
        v.spec.volumes.as_mut().unwrap()[1]
            .container_disk
            .as_mut()
            .unwrap()
            .path = Some(bad.into());
        assert!(
            matches!(image_copies(&v), Err(PodRenderError::BadImagePath { .. })),
            "{bad:?}"
        );
    }
    // "./disk.img" and "//a//b" normalise.
    let mut v = vmi();
    v.spec.volumes.as_mut().unwrap()[1]
        .container_disk
        .as_mut()
        .unwrap()
        .path = Some("//a/./b".into());
    assert_eq!(image_copies(&v).unwrap()[1].files, vec!["/a/b".to_string()]);
}

#[test]
fn a_vmi_without_images_has_no_init_containers() {
    let mut v = vmi();
    v.spec.volumes = None;
    v.spec.domain.firmware = None;
    let pod = launcher_pod(&v, &LauncherConfig::default()).unwrap();
    let spec = pod.spec.unwrap();
    assert!(spec.init_containers.is_none());
    let args = spec.containers[0].args.clone().unwrap();
    assert!(!args.iter().any(|a| a == "--image-dir"));
    assert!(
        !spec
            .volumes
            .unwrap()
            .iter()
            .any(|v| v.name == "images" || v.name == "virt-bin")
    );
}

/// The launcher holds its lifeline whenever a sidecar must end with it: the image copiers,
/// the console-log tail, or both; a pod without either has none.
#[test]
fn every_sidecar_ends_by_the_lifeline_and_only_a_pod_with_one_has_it() {
    let lifeline = |images: bool, console_log: bool| {
        let mut v = vmi();
        if !images {
            v.spec.volumes = None;
            v.spec.domain.firmware = None;
        }
        v.spec.domain.devices.log_serial_console = Some(console_log);
        let spec = launcher_pod(&v, &LauncherConfig::default())
            .unwrap()
            .spec
            .unwrap();
        let env = spec.containers[0].env.clone().unwrap_or_default();
        let held = env
            .iter()
            .find(|e| e.name == kubevirt_api::LAUNCHER_LIFELINE_ENV)
            .and_then(|e| e.value.clone());
        let has_volume = spec.volumes.unwrap().iter().any(|v| v.name == "life");
        assert_eq!(held.is_some(), has_volume);
        for c in &spec.containers[1..] {
            let mounts = c.volume_mounts.clone().unwrap_or_default();
            let life = mounts.iter().find(|m| m.name == "life");
            assert_eq!(
                life.and_then(|m| m.read_only),
                Some(true),
                "{} reads the lifeline",
                c.name
            );
            if c.name == CONSOLE_LOG_CONTAINER {
                let cmd = c.command.clone().unwrap();
                assert_eq!(cmd[0], "/usr/bin/virt-tail");
                assert!(cmd.contains(held.as_ref().unwrap()), "{cmd:?}");
            }
        }
        held.is_some()
    };
    assert!(lifeline(true, true));
    assert!(lifeline(true, false));
    assert!(lifeline(false, true));
    assert!(!lifeline(false, false));
}

/// The pod carries the VMI's labels (Services select VMs by them), but not the two that
/// describe the VMI's present pod: its node and an outdated launcher. A migration target
/// rendered while the VMI is labelled outdated runs the current launcher.
#[test]
fn the_pod_has_the_vmi_labels_but_not_its_node_or_outdated_launcher() {
    let mut v = vmi();
    v.metadata.labels = Some(
        [
            ("app", "demo"),
            ("kubevirt.io/nodeName", "node-1"),
            ("kubevirt.io/outdatedLauncherImage", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    let labels = launcher_pod(&v, &LauncherConfig::default())
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert_eq!(labels["app"], "demo");
    assert!(!labels.contains_key("kubevirt.io/nodeName"));
    assert!(!labels.contains_key("kubevirt.io/outdatedLauncherImage"));
}

#[test]
fn hostnames_are_dns_labels() {
    assert_eq!(hostname_of("demo"), "demo");
    assert_eq!(hostname_of("web.prod"), "web-prod");
    let long = format!("{}.x", "a".repeat(62));
    assert_eq!(hostname_of(&long), "a".repeat(62));
    assert_eq!(hostname_of(&"b".repeat(100)), "b".repeat(63));
}

#[test]
fn a_long_vmi_name_is_no_label_value() {
    let mut v = vmi();
    v.metadata.name = Some("n".repeat(64));
    let pod = launcher_pod(&v, &LauncherConfig::default()).unwrap();
    let labels = pod.metadata.labels.unwrap();
    assert!(!labels.contains_key("vm.kubevirt.io/name"));
    assert_eq!(labels["kubevirt.io/created-by"], "vmi-uid");
}

/// Inline cloud-init data never reaches the pod (its annotations are readable by `view`):
/// it goes into the VMI's own Secret, mounted with the Secrets the VMI names.
#[test]
fn cloud_init_data_travels_in_secrets_not_in_the_pod() {
    let mut v = vmi();
    let extra: Vec<kubevirt_api::vmi::Volume> = serde_json::from_value(json!([
        {"name": "ci", "cloudInitNoCloud": {"userData": "#cloud-config\npassword: hunter2\n"}},
        {"name": "ci2", "cloudInitNoCloud": {"secretRef": {"name": "my-user-data"}}}
    ]))
    .unwrap();
    v.spec.volumes.get_or_insert_default().extend(extra);
    let pod = launcher_pod(&v, &LauncherConfig::default()).unwrap();
    let text = serde_json::to_string(&pod).unwrap();
    assert!(!text.contains("hunter2"), "{text}");
    let pod = serde_json::to_value(&pod).unwrap();
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    let secrets: Vec<&str> = volumes
        .iter()
        .filter_map(|v| v["secret"]["secretName"].as_str())
        .collect();
    assert_eq!(secrets, ["kubevirt-rs-cloud-init-vmi-uid", "my-user-data"]);
    let mounts: Vec<&str> = pod["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .filter(|p| p.contains("cloud-init"))
        .collect();
    assert_eq!(
        mounts,
        [
            "/var/run/kubevirt-rs/cloud-init/inline",
            "/var/run/kubevirt-rs/cloud-init/ci2.user"
        ]
    );
    let secret = super::render::cloud_init_secret(&v).unwrap().unwrap();
    assert_eq!(
        secret
            .string_data
            .unwrap()
            .get("ci.userData")
            .map(String::as_str),
        Some("#cloud-config\npassword: hunter2\n")
    );
    assert_eq!(
        secret.metadata.owner_references.unwrap()[0].uid,
        "vmi-uid",
        "goes with its VMI"
    );
    assert!(super::render::cloud_init_secret(&vmi()).unwrap().is_none());
}

/// Each access credential's Secret is mounted once, optional (a missing one is named in the
/// VMI's `AccessCredentialsSynchronized`, not a pod stuck creating), where the launcher
/// looks for it.
#[test]
fn access_credential_secrets_are_mounted_once_and_optional() {
    let mut v = vmi();
    v.spec.access_credentials = Some(
        serde_json::from_value(json!([
            {"sshPublicKey": {"source": {"secret": {"secretName": "keys"}},
                              "propagationMethod": {"qemuGuestAgent": {"users": ["root"]}}}},
            {"userPassword": {"source": {"secret": {"secretName": "pw"}},
                              "propagationMethod": {"qemuGuestAgent": {}}}},
            {"sshPublicKey": {"source": {"secret": {"secretName": "keys"}},
                              "propagationMethod": {"qemuGuestAgent": {"users": ["tester"]}}}}
        ]))
        .unwrap(),
    );
    let pod = serde_json::to_value(launcher_pod(&v, &LauncherConfig::default()).unwrap()).unwrap();
    let secrets: Vec<(&str, bool)> = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| {
            Some((
                v["secret"]["secretName"].as_str()?,
                v["secret"]["optional"] == true,
            ))
        })
        .collect();
    assert_eq!(secrets, [("keys", true), ("pw", true)]);
    let mounts: Vec<&str> = pod["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .filter(|p| p.contains("access-cred"))
        .collect();
    assert_eq!(
        mounts,
        [
            "/var/run/kubevirt-rs/access-credentials/keys-access-cred",
            "/var/run/kubevirt-rs/access-credentials/pw-access-cred"
        ]
    );
    let args = pod["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains(r#""--access-credentials-dir","/var/run/kubevirt-rs/access-credentials""#),
        "{args}"
    );
}

/// Claims are mounted as their volumeMode says, from what volumeStatus records; the user's
/// volume names never become pod volume names.
#[test]
fn claims_are_mounted_where_kubevirt_mounts_them() {
    let mut v = vmi();
    let extra: Vec<kubevirt_api::vmi::Volume> = serde_json::from_value(json!([
        {"name": "work", "persistentVolumeClaim": {"claimName": "data-claim"}},
        {"name": "raw", "persistentVolumeClaim": {"claimName": "raw-claim", "readOnly": true}}
    ]))
    .unwrap();
    v.spec.volumes.get_or_insert_default().extend(extra);
    assert_eq!(
        launcher_pod(&v, &LauncherConfig::default()).unwrap_err(),
        PodRenderError::UnknownClaim("work".into())
    );
    v.status = Some(
        serde_json::from_value(json!({"volumeStatus": [
            {"name": "work", "persistentVolumeClaimInfo": {"volumeMode": "Filesystem",
                "capacity": {"storage": "1Gi"}, "filesystemOverhead": "0.055"}},
            {"name": "raw", "persistentVolumeClaimInfo": {"volumeMode": "Block",
                "capacity": {"storage": "2Gi"}}}
        ]}))
        .unwrap(),
    );
    let pod = serde_json::to_value(launcher_pod(&v, &LauncherConfig::default()).unwrap()).unwrap();
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    let claims: Vec<(&str, &str)> = volumes
        .iter()
        .filter_map(|v| {
            Some((
                v["name"].as_str()?,
                v["persistentVolumeClaim"]["claimName"].as_str()?,
            ))
        })
        .collect();
    assert_eq!(
        claims,
        [("claim-0", "data-claim"), ("claim-1", "raw-claim")]
    );
    assert_eq!(volumes.iter().filter(|v| v["name"] == "work").count(), 1);
    let c = &pod["spec"]["containers"][0];
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "claim-0")
        .unwrap();
    assert_eq!(
        mount["mountPath"],
        "/var/run/kubevirt-private/vmi-disks/work"
    );
    assert_eq!(
        c["volumeDevices"],
        json!([{"name": "claim-1", "devicePath": "/dev/vmi-disks/raw"}])
    );
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    let joined = args.join(" ");
    // 1 GiB less 5.5 %, in whole MiB: 967 MiB.
    assert!(
        joined.contains(
            "--claim work=/var/run/kubevirt-private/vmi-disks/work --claim-disk-size work=1013972992 --claim raw=/dev/vmi-disks/raw"
        ),
        "{joined}"
    );
}

/// Pod Security `baseline` and `restricted` forbid host paths: a launcher pod has none,
/// whatever its VMI asks for.
#[test]
fn launcher_pod_has_no_host_path() {
    for cfg in [
        LauncherConfig::default(),
        LauncherConfig {
            allow_emulation: true,
            ..LauncherConfig::default()
        },
    ] {
        let pod = launcher_pod(&vmi(), &cfg).unwrap();
        let volumes = pod.spec.unwrap().volumes.unwrap_or_default();
        assert!(
            volumes.iter().all(|v| v.host_path.is_none()),
            "{:?}",
            volumes.iter().map(|v| &v.name).collect::<Vec<_>>()
        );
    }
}

/// KubeVirt's rule for the `guest-console-log` container: no serial console, no log; the
/// VMI's `logSerialConsole` over the cluster's default.
#[test]
fn the_serial_console_is_logged_by_the_vmi_then_the_cluster_default() {
    let with = |auto: Option<bool>, log: Option<bool>, default: bool| {
        let mut v = vmi();
        v.spec.domain.devices.autoattach_serial_console = auto;
        v.spec.domain.devices.log_serial_console = log;
        let cfg = LauncherConfig {
            serial_console_log: default,
            ..LauncherConfig::default()
        };
        let pod = launcher_pod(&v, &cfg).unwrap();
        let spec = pod.spec.unwrap();
        let names: Vec<String> = spec.containers.iter().map(|c| c.name.clone()).collect();
        let args = spec.containers[0].args.clone().unwrap_or_default();
        let logged = names.iter().any(|n| n == CONSOLE_LOG_CONTAINER);
        // The launcher writes the file exactly when a container reads it.
        assert_eq!(
            logged,
            args.iter().any(|a| a == "--console-log"),
            "{names:?}"
        );
        logged
    };
    assert!(with(None, None, true));
    assert!(!with(None, None, false));
    assert!(with(None, Some(true), false));
    assert!(!with(None, Some(false), true));
    assert!(!with(Some(false), Some(true), true));
    assert!(with(Some(true), None, true));
}

/// A VMI with limits for CPU and memory has a Guaranteed pod: the log container's requests
/// equal its limits so that the second container keeps that QoS class.
#[test]
fn the_console_log_container_keeps_guaranteed_qos() {
    let mut v = vmi();
    v.spec.domain.resources = Some(
        serde_json::from_value(json!({
            "requests": {"cpu": "1", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "128Mi"}
        }))
        .unwrap(),
    );
    let pod = launcher_pod(&v, &LauncherConfig::default()).unwrap();
    let spec = pod.spec.unwrap();
    let log = spec
        .containers
        .iter()
        .find(|c| c.name == CONSOLE_LOG_CONTAINER)
        .unwrap();
    let r = log.resources.as_ref().unwrap();
    assert_eq!(r.requests, r.limits);
    // Burstable VMIs: a smaller request.
    let pod = launcher_pod(&vmi(), &LauncherConfig::default()).unwrap();
    let spec = pod.spec.unwrap();
    let r = spec.containers[1].resources.as_ref().unwrap();
    assert_ne!(r.requests, r.limits);
}
