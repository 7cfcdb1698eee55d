//! The replica set and pool controllers against a real kube-apiserver and etcd (our kinds
//! from CRDs, [`support`]): scale out and in, a deleted member replaced (a pool's under
//! the same name), `paused` holding everything, the status with the counts and the
//! selector, owner references to the replica set or pool, a template change rolled out.
//! (The garbage collector, which deletes the VMs and VMIs with their pool or replica set,
//! runs only in a cluster: e2e `pool.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::pool::{REVISION_LABEL, VirtualMachinePool};
use kubevirt_api::replicaset::VirtualMachineInstanceReplicaSet;
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};
use serde_json::{Value, json};
use support::{KubeApi, NS, VM, VMI, VMIRS, eventually};
use tokio_util::sync::CancellationToken;
use virt_controllers::events::Recorder;
use virt_controllers::vmi::render::LauncherConfig;
use virt_controllers::{Config, Context};

const TOKEN: &str = "pool-test-token";

fn context(client: &Client) -> Arc<Context> {
    let config = Config {
        namespace: Some(NS.to_string()),
        error_backoff_base: Duration::from_millis(100),
        error_backoff_max: Duration::from_secs(1),
        launcher: LauncherConfig {
            allow_emulation: true,
            ..LauncherConfig::default()
        },
        ..Config::default()
    };
    let recorder = Recorder::new(client.clone(), "virt-controller", "test");
    Arc::new(Context::new(client.clone(), Some(recorder), config))
}

fn merge(v: Value) -> Patch<Value> {
    Patch::Merge(v)
}

/// The names of the VMIs `uid` controls that are not being deleted.
async fn active_vmis(api: &Api<VirtualMachineInstance>, uid: &str) -> BTreeSet<String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .filter(|v| v.owner_references().iter().any(|o| o.uid == uid))
        .map(|v| v.name_any())
        .collect()
}

async fn active_vms(api: &Api<VirtualMachine>, uid: &str) -> BTreeSet<String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .filter(|v| {
            v.owner_references()
                .iter()
                .any(|o| o.uid == uid && o.controller == Some(true))
        })
        .map(|v| v.name_any())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn replica_set_scales_heals_and_pauses() {
    let api = KubeApi::start(TOKEN, &[VMI, VM, VMIRS]).await;
    let client = api.client.clone();
    let ctx = context(&client);
    let stop = CancellationToken::new();
    let vmis = virt_controllers::vmi::shared(&ctx, stop.clone());
    tokio::spawn(virt_controllers::vmi::run(
        ctx.clone(),
        vmis.clone(),
        stop.clone(),
    ));
    tokio::spawn(virt_controllers::replicaset::run(
        ctx.clone(),
        vmis,
        stop.clone(),
    ));

    let rss = Api::<VirtualMachineInstanceReplicaSet>::namespaced(client.clone(), NS);
    let rs: VirtualMachineInstanceReplicaSet = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceReplicaSet",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}}}
    }))
    .unwrap();
    let rs = rss.create(&PostParams::default(), &rs).await.unwrap();
    let uid = rs.uid().unwrap();
    let vmi_api = api.vmis();
    let want = |n: usize| {
        let (vmi_api, uid) = (vmi_api.clone(), uid.clone());
        async move {
            eventually(&format!("{n} VMIs"), || async {
                let names = active_vmis(&vmi_api, &uid).await;
                (names.len() == n).then_some(names)
            })
            .await
        }
    };
    let two = want(2).await;
    for name in &two {
        assert!(name.starts_with("web"), "{name}: <rs><suffix>");
        let vmi = vmi_api.get(name).await.unwrap();
        let owner = &vmi.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("VirtualMachineInstanceReplicaSet", Some(true))
        );
        assert_eq!(vmi.labels()["app"], "web");
    }
    let status = eventually("status with 2 replicas and the selector", || async {
        let rs = rss.get("web").await.unwrap();
        rs.status.filter(|s| s.replicas == Some(2))
    })
    .await;
    assert_eq!(status.label_selector.as_deref(), Some("app=web"));

    // Scale out, then a deleted VMI is replaced at once (it counts as gone when marked).
    rss.patch(
        "web",
        &PatchParams::default(),
        &merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    let three = want(3).await;
    let victim = three.iter().next().unwrap().clone();
    vmi_api
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    let healed = eventually("a replacement for the deleted VMI", || async {
        let names = active_vmis(&vmi_api, &uid).await;
        (names.len() == 3 && !names.contains(&victim)).then_some(names)
    })
    .await;
    assert_eq!(healed.len(), 3);

    // Scale in.
    rss.patch(
        "web",
        &PatchParams::default(),
        &merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .unwrap();
    want(1).await;

    // Paused: nothing happens, the condition says why; unpaused, it catches up.
    rss.patch(
        "web",
        &PatchParams::default(),
        &merge(json!({"spec": {"paused": true, "replicas": 3}})),
    )
    .await
    .unwrap();
    eventually("ReplicaPaused", || async {
        let rs = rss.get("web").await.unwrap();
        rs.status
            .and_then(|s| s.conditions)
            .filter(|c| c.iter().any(|c| c.type_ == "ReplicaPaused"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(active_vmis(&vmi_api, &uid).await.len(), 1, "paused");
    rss.patch(
        "web",
        &PatchParams::default(),
        &merge(json!({"spec": {"paused": false}})),
    )
    .await
    .unwrap();
    want(3).await;
    eventually("ReplicaPaused gone", || async {
        let rs = rss.get("web").await.unwrap();
        let conds = rs.status.and_then(|s| s.conditions).unwrap_or_default();
        (!conds.iter().any(|c| c.type_ == "ReplicaPaused")).then_some(())
    })
    .await;
    stop.cancel();
}

fn pool_object(replicas: i64, extra: Value) -> VirtualMachinePool {
    let mut spec = json!({"replicas": replicas, "selector": {"matchLabels": {"app": "db"}},
        "scaleInStrategy": {"proactive": {"selectionPolicy": {"sortPolicy": "DescendingOrder"}}},
        "virtualMachineTemplate": {"metadata": {"labels": {"app": "db"}},
            "spec": {"runStrategy": "Halted", "template": {"metadata": {"labels": {"app": "db"}},
                "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}}}}});
    json_patch::merge(&mut spec, &extra);
    serde_json::from_value(json!({
        "apiVersion": "pool.kubevirt.io/v1beta1", "kind": "VirtualMachinePool",
        "metadata": {"name": "db", "namespace": NS}, "spec": spec}))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn pool_scales_replaces_pauses_and_updates() {
    let api = KubeApi::start(TOKEN, &[VMI, VM]).await;
    api.install_pools().await;
    let client = api.client.clone();
    let ctx = context(&client);
    let stop = CancellationToken::new();
    let vmis = virt_controllers::vmi::shared(&ctx, stop.clone());
    tokio::spawn(virt_controllers::pool::run(ctx.clone(), vmis, stop.clone()));

    let pools = Api::<VirtualMachinePool>::namespaced(client.clone(), NS);
    let pool = pools
        .create(&PostParams::default(), &pool_object(2, json!({})))
        .await
        .unwrap();
    let uid = pool.uid().unwrap();
    let vms = api.vms();
    let want = |names: &'static [&'static str]| {
        let (vms, uid) = (vms.clone(), uid.clone());
        async move {
            let want: BTreeSet<String> = names.iter().map(|s| s.to_string()).collect();
            eventually(&format!("VMs {names:?}"), || async {
                (active_vms(&vms, &uid).await == want).then_some(())
            })
            .await
        }
    };
    want(&["db-0", "db-1"]).await;
    let vm = vms.get("db-0").await.unwrap();
    let owner = &vm.owner_references()[0];
    assert_eq!(owner.kind, "VirtualMachinePool");
    assert_eq!(owner.api_version, "pool.kubevirt.io/v1beta1");
    assert_eq!(owner.controller, Some(true));
    assert!(vm.labels().contains_key(REVISION_LABEL));
    assert_eq!(vm.labels()["app"], "db");
    eventually("status with 2 replicas and the selector", || async {
        let p = pools.get("db").await.unwrap();
        p.status
            .filter(|s| s.replicas == Some(2) && s.label_selector.as_deref() == Some("app=db"))
    })
    .await;

    // Scale out; a deleted member comes back under its name (a new VM).
    pools
        .patch(
            "db",
            &PatchParams::default(),
            &merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    want(&["db-0", "db-1", "db-2"]).await;
    let old = vms.get("db-1").await.unwrap().uid().unwrap();
    vms.delete("db-1", &DeleteParams::default()).await.unwrap();
    eventually("db-1 made again", || async {
        let vm = vms.get_opt("db-1").await.unwrap()?;
        (vm.uid().unwrap() != old).then_some(())
    })
    .await;
    want(&["db-0", "db-1", "db-2"]).await;

    // Scale in, highest ordinals first (DescendingOrder).
    pools
        .patch(
            "db",
            &PatchParams::default(),
            &merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    want(&["db-0"]).await;

    // Paused: nothing is made.
    pools
        .patch(
            "db",
            &PatchParams::default(),
            &merge(json!({"spec": {"paused": true, "replicas": 2}})),
        )
        .await
        .unwrap();
    eventually("ReplicaPaused", || async {
        let p = pools.get("db").await.unwrap();
        p.status
            .and_then(|s| s.conditions)
            .filter(|c| c.iter().any(|c| c.type_ == "ReplicaPaused"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(active_vms(&vms, &uid).await.len(), 1, "paused");

    // Unpaused with a new template: the missing VM is made and the old one rewritten.
    let before = vms.get("db-0").await.unwrap().labels()[REVISION_LABEL].clone();
    pools
        .patch(
            "db",
            &PatchParams::default(),
            &merge(json!({"spec": {"paused": false, "virtualMachineTemplate":
                {"metadata": {"labels": {"app": "db", "tier": "2"}}}}})),
        )
        .await
        .unwrap();
    want(&["db-0", "db-1"]).await;
    let updated = eventually("db-0 rewritten from the new template", || async {
        let vm = vms.get("db-0").await.unwrap();
        (vm.labels()[REVISION_LABEL] != before && vm.labels().get("tier").is_some()).then_some(vm)
    })
    .await;
    let template_labels = updated
        .spec
        .template
        .metadata
        .clone()
        .unwrap()
        .labels
        .unwrap();
    assert_eq!(
        template_labels[REVISION_LABEL],
        updated.labels()[REVISION_LABEL]
    );
    stop.cancel();
}
