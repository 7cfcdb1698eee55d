#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;

use super::*;

fn vmi(v: serde_json::Value) -> Arc<VirtualMachineInstance> {
    let mut base = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1", "namespace": "ns", "uid": "u1"}, "spec": {"domain": {}}});
    json_patch::merge(&mut base, &v);
    Arc::new(serde_json::from_value(base).unwrap())
}

fn vm(v: serde_json::Value) -> Arc<VirtualMachine> {
    let mut base = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "vm1", "namespace": "ns", "uid": "u1"},
        "spec": {"template": {"spec": {"domain": {}}}}});
    json_patch::merge(&mut base, &v);
    Arc::new(serde_json::from_value(base).unwrap())
}

/// The series of `name` as (label, value) maps with their values.
fn series(fams: &[Family], name: &str) -> Vec<(HashMap<&'static str, String>, f64)> {
    fams.iter()
        .filter(|f| f.desc.name == name)
        .flat_map(|f| {
            f.samples
                .iter()
                .map(|s| (f.labelled(s).into_iter().collect(), s.value))
        })
        .collect()
}

fn one(fams: &[Family], name: &str) -> (HashMap<&'static str, String>, f64) {
    let mut s = series(fams, name);
    assert_eq!(s.len(), 1, "{name}: {s:?}");
    s.remove(0)
}

#[test]
fn the_bundle_names_are_read() {
    let (types, prefs) = bundle();
    assert!(types.contains("u1.medium"), "{types:?}");
    assert!(types.len() > 20);
    assert!(prefs.contains("fedora"), "{prefs:?}");
    assert!(!types.contains("spec"));
}

/// A running VMI with guest OS info, an instance type of the bundle, addresses and a
/// finished migration: KubeVirt's label values.
#[test]
fn a_running_vmi_with_guest_info_and_a_bundle_instance_type() {
    let v = vmi(json!({
        "metadata": {
            "annotations": {
                "vm.kubevirt.io/os": "fedora", "vm.kubevirt.io/workload": "server",
                "vm.kubevirt.io/flavor": "small",
                "kubevirt.io/cluster-instancetype-name": "u1.medium",
                "kubevirt.io/cluster-preference-name": "my-own",
            },
            "labels": {"kubevirt.io/outdatedLauncherImage": ""},
        },
        "status": {
            "phase": "Running", "nodeName": "node1",
            "machine": {"type": "pc-q35-rhel9.6.0"},
            "guestOSInfo": {"name": "Fedora Linux", "kernelRelease": "6.8.5", "machine": "x86_64",
                "versionId": "40", "id": "fedora"},
            "conditions": [{"type": "LiveMigratable", "status": "True"}],
            "interfaces": [
                {"name": "default", "interfaceName": "eth0", "ipAddress": "10.0.0.5"},
                {"name": "sec", "interfaceName": "eth1"},
                {"mac": "02:00:00:00:00:01"},
            ],
            "migrationState": {"migrationUid": "m-uid", "startTimestamp": "2026-01-01T00:00:00Z",
                "endTimestamp": "2026-01-01T00:00:09Z", "completed": true},
        },
    }));
    let cx = VmiContext {
        eviction_default: Some(EvictionStrategy::LiveMigrate),
        launcher_pods: HashMap::from([(
            "u1".to_string(),
            vec![
                ("node0".to_string(), "virt-launcher-vm1-old".to_string()),
                ("node1".to_string(), "virt-launcher-vm1-abcde".to_string()),
            ],
        )]),
        migrations: HashMap::from([("m-uid".to_string(), "mig1".to_string())]),
        ..VmiContext::default()
    };
    let fams = vmi_families(&[v], &cx);
    let (info, value) = one(&fams, "kubevirt_vmi_info");
    assert_eq!(value, 1.0);
    let want = [
        ("node", "node1"),
        ("namespace", "ns"),
        ("name", "vm1"),
        ("phase", "running"),
        ("os", "fedora"),
        ("workload", "server"),
        ("flavor", "small"),
        ("instance_type", "u1.medium"),
        ("preference", "<other>"),
        ("guest_os_kernel_release", "6.8.5"),
        ("guest_os_machine", "pc-q35-rhel9.6.0"),
        ("guest_os_arch", "x86_64"),
        ("guest_os_name", "Fedora Linux"),
        ("guest_os_version_id", "40"),
        ("evictable", "true"),
        ("outdated", "true"),
        ("vmi_pod", "virt-launcher-vm1-abcde"),
    ];
    assert_eq!(info.len(), want.len());
    for (k, v) in want {
        assert_eq!(info[k], v, "{k}");
    }
    assert_eq!(one(&fams, "kubevirt_vmi_non_evictable").1, 0.0);

    let addresses = series(&fams, "kubevirt_vmi_status_addresses");
    assert_eq!(addresses.len(), 2, "{addresses:?}");
    assert_eq!(addresses[0].0["type"], "ExternalInterface");
    assert_eq!(addresses[0].0["address"], "10.0.0.5");
    assert_eq!(addresses[0].0["vnic_name"], "default");
    assert_eq!(addresses[0].0["interface_name"], "eth0");
    assert_eq!(addresses[1].0["type"], "SystemInterface");
    assert_eq!(addresses[1].0["address"], "");

    let (start, t0) = one(&fams, "kubevirt_vmi_migration_start_time_seconds");
    assert_eq!(start["migration_name"], "mig1");
    assert_eq!(t0, 1767225600.0);
    let (end, t1) = one(&fams, "kubevirt_vmi_migration_end_time_seconds");
    assert_eq!(end["status"], "succeeded");
    assert_eq!(t1, 1767225609.0);
}

/// LiveMigrate (the VMI's or the cluster's) and no `LiveMigratable: True`: non-evictable,
/// as KubeVirt's rule; the other strategies never are.
#[test]
fn a_non_migratable_vmi_with_live_migrate_is_non_evictable() {
    let not_migratable = json!({"status": {"phase": "Scheduled", "nodeName": "n",
        "conditions": [{"type": "LiveMigratable", "status": "False", "reason": "DisksNotLiveMigratable"}]}});
    let cx = |d| VmiContext {
        eviction_default: Some(d),
        ..VmiContext::default()
    };
    let fams = vmi_families(
        &[vmi(not_migratable.clone())],
        &cx(EvictionStrategy::LiveMigrate),
    );
    let (labels, value) = one(&fams, "kubevirt_vmi_non_evictable");
    assert_eq!(value, 1.0);
    assert_eq!(labels["node"], "n");
    let (info, _) = one(&fams, "kubevirt_vmi_info");
    assert_eq!(info["evictable"], "false");
    assert_eq!(info["phase"], "scheduled");
    assert_eq!(info["instance_type"], "");
    assert_eq!(info["vmi_pod"], "");

    // Its own strategy wins over the cluster's.
    let mut own = not_migratable.clone();
    own["spec"] = json!({"evictionStrategy": "LiveMigrate", "domain": {}});
    assert!(!evictable(&vmi(own.clone()), EvictionStrategy::None));
    own["spec"]["evictionStrategy"] = json!("None");
    assert!(evictable(&vmi(own), EvictionStrategy::LiveMigrate));
    // No condition yet: not evictable (KubeVirt errs on the alert's side); Unknown is.
    assert!(!evictable(&vmi(json!({})), EvictionStrategy::LiveMigrate));
    let unknown =
        json!({"status": {"conditions": [{"type": "LiveMigratable", "status": "Unknown"}]}});
    assert!(evictable(&vmi(unknown), EvictionStrategy::LiveMigrate));
    for s in [
        EvictionStrategy::None,
        EvictionStrategy::LiveMigrateIfPossible,
        EvictionStrategy::External,
    ] {
        assert!(evictable(&vmi(not_migratable.clone()), s), "{s}");
    }
}

/// A VM with requests, limits, a topology and hugepages: KubeVirt's resource series.
#[test]
fn a_vm_with_requests_and_limits() {
    let v = vm(json!({
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"template": {
            "metadata": {"annotations": {"vm.kubevirt.io/os": "rhel9"}},
            "spec": {"domain": {
                "machine": {"type": "q35"},
                "cpu": {"cores": 2, "sockets": 1},
                "memory": {"guest": "1Gi", "hugepages": {"pageSize": "2Mi"}},
                "resources": {"requests": {"memory": "1100Mi", "cpu": "1500m"},
                    "limits": {"memory": "2Gi", "cpu": "2"}},
            }},
        }},
        "status": {"printableStatus": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:01:00Z"},
            {"type": "Paused", "status": "False", "lastTransitionTime": "2026-01-01T00:00:30Z"},
            {"type": "Other", "status": "True", "lastTransitionTime": "2026-01-01T00:09:00Z"},
        ]},
    }));
    let fams = vm_families(&[v], &[]);
    let requests: Vec<_> = series(&fams, "kubevirt_vm_resource_requests")
        .into_iter()
        .map(|(l, v)| {
            (
                l["resource"].clone(),
                l["unit"].clone(),
                l["source"].clone(),
                v,
            )
        })
        .collect();
    let s =
        |r: &str, u: &str, src: &str, v: f64| (r.to_string(), u.to_string(), src.to_string(), v);
    assert_eq!(
        requests,
        vec![
            s("memory", "bytes", "domain", 1100.0 * 1024.0 * 1024.0),
            s("memory", "bytes", "guest", 1024.0 * 1024.0 * 1024.0),
            s("memory", "bytes", "hugepages", 2.0 * 1024.0 * 1024.0),
            s("cpu", "cores", "domain", 2.0),
            s("cpu", "sockets", "domain", 1.0),
            s("cpu", "cores", "requests", 1.5),
        ]
    );
    let limits: Vec<_> = series(&fams, "kubevirt_vm_resource_limits")
        .into_iter()
        .map(|(l, v)| (l["resource"].clone(), l["unit"].clone(), v))
        .collect();
    assert_eq!(
        limits,
        vec![
            (
                "memory".to_string(),
                "bytes".to_string(),
                2.0 * 1024.0 * 1024.0 * 1024.0
            ),
            ("cpu".to_string(), "cores".to_string(), 2.0),
        ]
    );
    let (info, _) = one(&fams, "kubevirt_vm_info");
    assert_eq!(info["os"], "rhel9");
    assert_eq!(info["workload"], "");
    assert_eq!(info["machine_type"], "q35");
    assert_eq!(info["status"], "running");
    assert_eq!(info["status_group"], "running");
    assert_eq!(info["instance_type"], "");
    assert_eq!(
        one(&fams, "kubevirt_vm_create_date_timestamp_seconds").1,
        1767225600.0
    );
    // The latest of Ready/Failure/Paused in the running family, 0 in the others.
    assert_eq!(
        one(
            &fams,
            "kubevirt_vm_running_status_last_transition_timestamp_seconds"
        )
        .1,
        1767225660.0
    );
    for other in ["starting", "migrating", "non_running", "error"] {
        let name = format!("kubevirt_vm_{other}_status_last_transition_timestamp_seconds");
        assert_eq!(one(&fams, &name).1, 0.0, "{name}");
    }
}

/// A bare VM: KubeVirt's default CPU series; an instance-type VM: the name of a bundle
/// type, no default series (the type gives a topology we do not see).
#[test]
fn defaults_instance_types_and_status_groups() {
    let bare = vm(json!({"status": {"printableStatus": "ErrorUnschedulable"}}));
    let typed = vm(json!({"metadata": {"name": "vm2"}, "spec": {
        "instancetype": {"name": "u1.medium", "kind": "VirtualMachineClusterInstancetype"},
        "preference": {"name": "fedora", "kind": "VirtualMachinePreference"}}}));
    let fams = vm_families(&[bare, typed], &[]);
    let defaults: Vec<_> = series(&fams, "kubevirt_vm_resource_requests")
        .into_iter()
        .map(|(l, v)| (l["name"].clone(), l["unit"].clone(), l["source"].clone(), v))
        .collect();
    assert_eq!(
        defaults,
        ["cores", "threads", "sockets"].map(|u| (
            "vm1".to_string(),
            u.to_string(),
            "default".to_string(),
            1.0
        ))
    );
    let infos = series(&fams, "kubevirt_vm_info");
    assert_eq!(infos[0].0["status"], "errorunschedulable");
    assert_eq!(infos[0].0["status_group"], "error");
    assert_eq!(infos[1].0["instance_type"], "u1.medium");
    assert_eq!(infos[1].0["preference"], "<other>");
    assert_eq!(infos[1].0["status"], "");
    assert_eq!(infos[1].0["status_group"], "<unknown>");
    // No condition with a time: -1 in the current status's family (KubeVirt's).
    let errors = series(
        &fams,
        "kubevirt_vm_error_status_last_transition_timestamp_seconds",
    );
    assert_eq!(errors[0].1, -1.0);
    assert_eq!(errors[1].1, -1.0, "an unknown status counts as an error");
    assert_eq!(
        status_group(Some(PrintableStatus::WaitingForVolumeBinding)),
        "starting"
    );
    assert_eq!(status_group(Some(PrintableStatus::Paused)), "non_running");
    assert_eq!(status_group(Some(PrintableStatus::Migrating)), "migrating");
}

#[test]
fn every_family_is_kubevirts_and_once() {
    let names: HashSet<_> = ALL.iter().map(|d| d.name).collect();
    assert_eq!(names.len(), ALL.len());
    assert_eq!(ALL.len(), 24);
    let order: Vec<&str> = VMI_FAMILIES
        .iter()
        .chain(&VM_FAMILIES)
        .chain(&MIGRATION_FAMILIES)
        .map(|d| d.name)
        .collect();
    assert_eq!(order, ALL.iter().map(|d| d.name).collect::<Vec<_>>());
    assert!(
        VMI_FAMILIES
            .iter()
            .all(|d| d.name.starts_with("kubevirt_vmi_"))
    );
    assert!(
        VM_FAMILIES
            .iter()
            .all(|d| d.name.starts_with("kubevirt_vm_"))
    );
    assert!(
        MIGRATION_FAMILIES
            .iter()
            .all(|d| d.name.starts_with("kubevirt_vmi_migration"))
    );
}

/// Interfaces as KubeVirt's collectors report them: the pod network's and a Multus
/// network's, each binding named; an interface without a network of either kind has none.
#[test]
fn vnics_of_a_vm_and_its_vmi() {
    let spec = json!({"domain": {"devices": {"interfaces": [
            {"name": "default", "masquerade": {}},
            {"name": "data", "bridge": {}, "model": "e1000"},
            {"name": "plug", "binding": {"name": "passt"}},
            {"name": "orphan", "bridge": {}}]}},
        "networks": [{"name": "default", "pod": {}},
            {"name": "data", "multus": {"networkName": "ns/vlan10"}},
            {"name": "plug", "pod": {}}]});
    let v = vm(json!({"spec": {"template": {"spec": spec}}}));
    let fams = vm_families(&[v], &[]);
    let mut got: Vec<Vec<String>> = series(&fams, "kubevirt_vm_vnic_info")
        .into_iter()
        .map(|(l, value)| {
            assert_eq!(value, 1.0);
            [
                "name",
                "namespace",
                "vnic_name",
                "binding_type",
                "network",
                "binding_name",
                "model",
            ]
            .iter()
            .map(|k| l[k].clone())
            .collect()
        })
        .collect();
    got.sort();
    let want: Vec<Vec<String>> = [
        ["vm1", "ns", "data", "core", "ns/vlan10", "bridge", "e1000"],
        [
            "vm1",
            "ns",
            "default",
            "core",
            "pod networking",
            "masquerade",
            "<none>",
        ],
        [
            "vm1",
            "ns",
            "plug",
            "plugin",
            "pod networking",
            "passt",
            "<none>",
        ],
    ]
    .iter()
    .map(|r| r.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(got, want);

    let i = vmi(json!({"spec": spec, "status": {"phase": "Running", "nodeName": "n1"}}));
    let cx = VmiContext {
        launcher_overhead: [("u1".to_string(), 188.0 * 1048576.0)].into(),
        ..Default::default()
    };
    let fams = vmi_families(&[i], &cx);
    assert_eq!(series(&fams, "kubevirt_vmi_vnic_info").len(), 3);
    let (l, v) = one(&fams, "kubevirt_vmi_launcher_memory_overhead_bytes");
    assert_eq!((l["namespace"].as_str(), l["name"].as_str()), ("ns", "vm1"));
    assert_eq!(v, 188.0 * 1048576.0);
}

/// KubeVirt's disk sizes: a claim's request with its volume mode, a DataVolume's size
/// from the VM's template; a volume whose claim is not in the cache has none.
#[test]
fn disk_sizes_come_from_claims_and_data_volume_templates() {
    let v = vm(json!({"spec": {
        "dataVolumeTemplates": [{"metadata": {"name": "boot"},
            "spec": {"storage": {"resources": {"requests": {"storage": "10Gi"}}}}}],
        "template": {"spec": {"volumes": [
            {"name": "rootdisk", "dataVolume": {"name": "boot"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-claim"}},
            {"name": "gone", "persistentVolumeClaim": {"claimName": "missing"}},
            {"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config"}}]}}}}));
    let claim = |name: &str, size: &str, mode: &str| -> Arc<PersistentVolumeClaim> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"},
                "spec": {"volumeMode": mode,
                    "resources": {"requests": {"storage": size}}}}))
            .unwrap(),
        )
    };
    let claims = [
        claim("boot", "11Gi", "Filesystem"),
        claim("data-claim", "2Gi", "Block"),
    ];
    let fams = vm_families(&[v], &claims);
    let mut got: Vec<(String, String, String, f64)> =
        series(&fams, "kubevirt_vm_disk_allocated_size_bytes")
            .into_iter()
            .map(|(l, v)| {
                (
                    l["persistentvolumeclaim"].clone(),
                    l["volume_mode"].clone(),
                    l["device"].clone(),
                    v,
                )
            })
            .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            (
                "boot".into(),
                "Filesystem".into(),
                "rootdisk".into(),
                10.0 * 1073741824.0
            ),
            (
                "data-claim".into(),
                "Block".into(),
                "data".into(),
                2.0 * 1073741824.0
            ),
        ]
    );
}

fn vmim(name: &str, phase: &str) -> Arc<VirtualMachineInstanceMigration> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": {"vmiName": "vm1"},
            "status": {"phase": phase},
        }))
        .unwrap(),
    )
}

#[test]
fn migrations_are_counted_per_phase_and_finished_ones_named() {
    let fams = migration_families(&[
        vmim("a", ""),
        vmim("b", "Pending"),
        vmim("c", "Scheduling"),
        vmim("d", "PreparingTarget"),
        vmim("e", "Running"),
        vmim("f", "Succeeded"),
        vmim("g", "Failed"),
    ]);
    for (name, n) in [
        ("kubevirt_vmi_migrations_in_unset_phase", 1.0),
        ("kubevirt_vmi_migrations_in_pending_phase", 1.0),
        ("kubevirt_vmi_migrations_in_scheduling_phase", 1.0),
        ("kubevirt_vmi_migrations_in_running_phase", 2.0),
    ] {
        assert_eq!(one(&fams, name).1, n, "{name}");
    }
    let (labels, v) = one(&fams, "kubevirt_vmi_migration_succeeded");
    assert_eq!(v, 1.0);
    assert_eq!(labels["vmi"], "vm1");
    assert_eq!(labels["vmim"], "f");
    assert_eq!(labels["namespace"], "ns");
    assert_eq!(one(&fams, "kubevirt_vmi_migration_failed").0["vmim"], "g");
}

#[test]
fn no_migrations_still_report_zero_counts() {
    let fams = migration_families(&[]);
    assert_eq!(
        one(&fams, "kubevirt_vmi_migrations_in_running_phase").1,
        0.0
    );
    assert!(series(&fams, "kubevirt_vmi_migration_succeeded").is_empty());
}
