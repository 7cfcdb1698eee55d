#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::*;

fn vmi(extra_spec: serde_json::Value, extra_status: serde_json::Value) -> VirtualMachineInstance {
    let mut spec = json!({"domain": {"devices": {}}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "a", "annotations": {}},
        "spec": spec, "status": extra_status,
    }))
    .unwrap()
}

#[test]
fn live_migratable_table() {
    let masq = json!({"domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}}]}},
                      "networks": [{"name": "default", "pod": {}}]});
    let bridge = json!({"domain": {"devices": {"interfaces": [{"name": "default", "bridge": {}}]}},
                        "networks": [{"name": "default", "pod": {}}]});
    let bridge_multus = json!({"domain": {"devices": {"interfaces": [{"name": "b", "bridge": {}}]}},
                        "networks": [{"name": "b", "multus": {"networkName": "br"}}]});
    let cases: Vec<(
        &str,
        serde_json::Value,
        serde_json::Value,
        Result<MigrationMethod, &str>,
    )> = vec![
        (
            "no volumes, masquerade",
            masq.clone(),
            json!({}),
            Ok(MigrationMethod::LiveMigration),
        ),
        (
            "containerDisk + cloudInit are copied",
            json!({"volumes": [
            {"name": "r", "containerDisk": {"image": "x"}},
            {"name": "c", "cloudInitNoCloud": {"userData": "#cloud-config"}}]}),
            json!({}),
            Ok(MigrationMethod::BlockMigration),
        ),
        (
            "emptyDisk is copied",
            json!({"volumes": [{"name": "e", "emptyDisk": {"capacity": "1Gi"}}]}),
            json!({}),
            Ok(MigrationMethod::BlockMigration),
        ),
        (
            "cloudInit alone is rebuilt",
            json!({"volumes": [
            {"name": "c", "cloudInitNoCloud": {"userData": "x"}}]}),
            json!({}),
            Ok(MigrationMethod::LiveMigration),
        ),
        (
            "non-shared hostDisk",
            json!({"volumes": [{"name": "h", "hostDisk": {"path": "/d.img", "type": "Disk"}}]}),
            json!({}),
            Err(not_migratable_reasons::DISKS),
        ),
        (
            "shared hostDisk",
            json!({"volumes": [{"name": "h", "hostDisk": {"path": "/d.img", "type": "Disk", "shared": true}}]}),
            json!({}),
            Ok(MigrationMethod::LiveMigration),
        ),
        (
            "PVC with unknown access modes",
            json!({"volumes": [{"name": "p", "persistentVolumeClaim": {"claimName": "c"}}]}),
            json!({}),
            Err(not_migratable_reasons::DISKS),
        ),
        (
            "RWO PVC is copied to a new claim",
            json!({"volumes": [{"name": "p", "persistentVolumeClaim": {"claimName": "c"}}]}),
            json!({"volumeStatus": [{"name": "p", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteOnce"]}}]}),
            Ok(MigrationMethod::BlockMigration),
        ),
        (
            "RWO PVC on a read-only disk cannot be copied",
            json!({"domain": {"devices": {"disks": [{"name": "p", "disk": {"readonly": true}}]}},
                   "volumes": [{"name": "p", "persistentVolumeClaim": {"claimName": "c"}}]}),
            json!({"volumeStatus": [{"name": "p", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteOnce"]}}]}),
            Err(not_migratable_reasons::DISKS),
        ),
        (
            "RWO PVC on a CD-ROM cannot be copied",
            json!({"domain": {"devices": {"disks": [{"name": "p", "cdrom": {}}]}},
                   "volumes": [{"name": "p", "persistentVolumeClaim": {"claimName": "c"}}]}),
            json!({"volumeStatus": [{"name": "p", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteOnce"]}}]}),
            Err(not_migratable_reasons::DISKS),
        ),
        (
            "PVC with an empty access mode list",
            json!({"volumes": [{"name": "p", "persistentVolumeClaim": {"claimName": "c"}}]}),
            json!({"volumeStatus": [{"name": "p", "persistentVolumeClaimInfo": {"accessModes": []}}]}),
            Err(not_migratable_reasons::DISKS),
        ),
        (
            "ROX PVC is shared",
            json!({"volumes": [{"name": "p", "persistentVolumeClaim": {"claimName": "c"}}]}),
            json!({"volumeStatus": [{"name": "p", "persistentVolumeClaimInfo": {"accessModes": ["ReadOnlyMany"]}}]}),
            Ok(MigrationMethod::LiveMigration),
        ),
        (
            "RWX PVC",
            json!({"volumes": [{"name": "p", "persistentVolumeClaim": {"claimName": "c"}}]}),
            json!({"volumeStatus": [{"name": "p", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteMany"]}}]}),
            Ok(MigrationMethod::LiveMigration),
        ),
        (
            "RWO DataVolume",
            json!({"volumes": [{"name": "d", "dataVolume": {"name": "dv"}}]}),
            json!({"volumeStatus": [{"name": "d", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteOnce"]}}]}),
            Err(not_migratable_reasons::DISKS),
        ),
        (
            "bridge on the pod network",
            bridge.clone(),
            json!({}),
            Err(not_migratable_reasons::INTERFACE),
        ),
        (
            "bridge on a multus network",
            bridge_multus,
            json!({}),
            Ok(MigrationMethod::LiveMigration),
        ),
        (
            "a hotplugged volume, even on a shared claim",
            json!({"volumes": [{"name": "hp", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}}]}),
            json!({"volumeStatus": [{"name": "hp", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteMany"]}}]}),
            Err(not_migratable_reasons::DISKS),
        ),
    ];
    for (name, spec, status, want) in cases {
        let got = live_migratable(&vmi(spec, status)).map_err(|e| e.reason);
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn copied_claims_are_the_unshared_claims_of_a_migratable_vmi() {
    let spec = json!({"volumes": [
        {"name": "a", "persistentVolumeClaim": {"claimName": "ca"}},
        {"name": "r", "containerDisk": {"image": "x"}},
        {"name": "b", "persistentVolumeClaim": {"claimName": "cb"}},
        {"name": "c", "persistentVolumeClaim": {"claimName": "cc"}}]});
    let status = json!({"volumeStatus": [
        {"name": "a", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteOnce"]}},
        {"name": "b", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteMany"]}},
        {"name": "c", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteOncePod"]}}]});
    let v = vmi(spec.clone(), status);
    assert_eq!(live_migratable(&v), Ok(MigrationMethod::BlockMigration));
    let got: Vec<(String, String)> = copied_claims(&v)
        .into_iter()
        .map(|c| (c.volume, c.claim))
        .collect();
    assert_eq!(got, [("a".into(), "ca".into()), ("c".into(), "cc".into())]);
    // Not migratable (c's access modes unknown): nothing is copied.
    let v = vmi(
        spec,
        json!({"volumeStatus": [{"name": "a", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteOnce"]}}]}),
    );
    assert!(live_migratable(&v).is_err());
    assert!(copied_claims(&v).is_empty());
}

#[test]
fn disks_are_checked_before_interfaces_with_kubevirts_messages() {
    let v = vmi(
        json!({"domain": {"devices": {"interfaces": [{"name": "default", "bridge": {}}]}},
               "networks": [{"name": "default", "pod": {}}],
               "volumes": [{"name": "p", "persistentVolumeClaim": {"claimName": "data"}}]}),
        json!({}),
    );
    let e = live_migratable(&v).unwrap_err();
    assert_eq!(e.reason, "DisksNotLiveMigratable");
    assert_eq!(
        e.message,
        "cannot migrate VMI: PVC data is not shared, live migration requires that all PVCs \
         must be shared (using ReadWriteMany access mode)"
    );
    let mut v = vmi(
        json!({"domain": {"devices": {"interfaces": [{"name": "default", "bridge": {}}]}},
               "networks": [{"name": "default", "pod": {}}]}),
        json!({}),
    );
    assert!(
        live_migratable(&v)
            .unwrap_err()
            .message
            .contains("masquerade")
    );
    v.metadata.annotations = Some(
        [(
            names::ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION.to_string(),
            String::new(),
        )]
        .into(),
    );
    assert_eq!(live_migratable(&v), Ok(MigrationMethod::LiveMigration));
}

#[test]
fn migration_state_round_trips_kubevirts_field_names() {
    let doc = json!({
        "startTimestamp": "2026-01-01T00:00:00Z", "endTimestamp": "2026-01-01T00:00:09Z",
        "targetNodeDomainReadyTimestamp": "2026-01-01T00:00:09Z",
        "targetNodeDomainDetected": true, "targetNodeAddress": "10.0.0.2",
        "targetDirectMigrationNodePorts": {"49152": 40001},
        "targetNode": "n2", "targetPod": "virt-launcher-a-x", "targetAttachmentPodUID": "u",
        "sourceNode": "n1", "sourcePod": "virt-launcher-a-y",
        "completed": true, "failed": false, "abortRequested": true, "abortStatus": "Aborting",
        "failureReason": "r", "migrationUid": "m", "mode": "PostCopy",
        "migrationPolicyName": "p", "targetCPUSet": [1, 2], "targetNodeTopology": "t",
        "dataTotalBytes": 10, "dataProcessedBytes": 5, "dataRemainingBytes": 5,
        "iteration": 2, "downtimeMs": 30
    });
    let s: VirtualMachineInstanceMigrationState = serde_json::from_value(doc.clone()).unwrap();
    assert_eq!(s.abort_status, Some(MigrationAbortStatus::Aborting));
    assert_eq!(s.mode, Some(MigrationMode::PostCopy));
    assert_eq!(serde_json::to_value(&s).unwrap(), doc);
    assert!(s.is_finished() && !s.is_transferring() && s.is_for("m"));
}

#[test]
fn migration_phases_are_kubevirts() {
    use VirtualMachineInstanceMigrationPhase as P;
    for p in [
        P::Pending,
        P::Scheduling,
        P::Scheduled,
        P::PreparingTarget,
        P::TargetReady,
        P::Running,
        P::Succeeded,
        P::Failed,
    ] {
        assert_eq!(serde_json::to_value(p).unwrap(), json!(p.as_str()));
    }
}
