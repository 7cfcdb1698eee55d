//! The recovering watcher against a real etcd and the real virt-apiserver: a watch
//! whose resourceVersion was compacted while it was down re-lists and sees what was
//! created after the compaction; a server that fails every request makes it start
//! over after a bounded number of attempts instead of retrying one version forever.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::PostParams;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::VirtualMachineInstance;
use serde_json::json;
use virt_devenv::{DevEnv, Options};
use virt_watch::{WatchLabels, WatchMetrics};

async fn start() -> (DevEnv, Client) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = tokio::task::spawn_blocking(|| {
        DevEnv::start(Options {
            apiserver_bin: virt_devenv::apiserver_bin_beside_test().expect("virt-apiserver binary"),
            // Without the watch cache: it would serve a compacted version it still holds,
            // and these tests are about what our watcher does on etcd's 410.
            extra_args: vec!["--watch-cache-history=0".into()],
            ..Options::default()
        })
        .expect("start etcd and virt-apiserver (is Debian's etcd-server installed?)")
    })
    .await
    .unwrap();
    let kc = kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    (env, Client::try_from(cfg).unwrap())
}

async fn create(api: &Api<VirtualMachineInstance>, name: &str) -> VirtualMachineInstance {
    let vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name},
        "spec": {
            "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                       "resources": {"requests": {"memory": "64Mi"}}},
            "volumes": [{"name": "root", "containerDisk": {"image": "example/guest:1"}}]}
    }))
    .unwrap();
    api.create(&PostParams::default(), &vmi).await.unwrap()
}

/// Polls `stream` until `want` holds for an event, returning the errors seen on the way.
async fn until<S>(
    stream: &mut S,
    what: &str,
    mut want: impl FnMut(&Event<VirtualMachineInstance>) -> bool,
) -> Vec<String>
where
    S: Stream<Item = watcher::Result<Event<VirtualMachineInstance>>> + Unpin,
{
    let mut errors = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}; errors: {errors:?}"))
            .expect("the watch stream never ends");
        match next {
            Ok(ev) if want(&ev) => return errors,
            Ok(_) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
}

fn named(ev: &Event<VirtualMachineInstance>, name: &str) -> bool {
    matches!(ev, Event::Apply(o) | Event::InitApply(o) if o.name_any() == name)
}

fn count(
    f: &prometheus_client::metrics::family::Family<
        WatchLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    reason: &str,
) -> u64 {
    f.get_or_create(&WatchLabels {
        watch: "vmis".into(),
        reason: reason.into(),
    })
    .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_behind_a_compaction_relists_and_sees_later_objects() {
    let (env, client) = start().await;
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
    let metrics = WatchMetrics::default();
    // The server ends each watch after a second, so the watcher keeps resuming from
    // the last resourceVersion it saw — as virt-handler does after every timeout.
    let mut stream = Box::pin(virt_watch::watch(
        Api::<VirtualMachineInstance>::all(client.clone()),
        watcher::Config::default().timeout(1),
        "vmis",
        metrics.clone(),
    ));
    until(&mut stream, "the initial list", |e| {
        matches!(e, Event::InitDone)
    })
    .await;

    // While nobody polls (the watch has timed out meanwhile), history moves on and is
    // compacted past the watcher's resourceVersion.
    tokio::time::sleep(Duration::from_secs(2)).await;
    create(&vmis, "before-1").await;
    create(&vmis, "before-2").await;
    let storage = virt_apiserver::storage::Storage::connect(std::slice::from_ref(&env.etcd_url))
        .await
        .unwrap();
    let now = storage.current_revision().await.unwrap();
    storage.compact(now).await.unwrap();

    let errors = until(&mut stream, "the re-list with before-2", |e| {
        named(e, "before-2")
    })
    .await;
    assert!(
        errors
            .iter()
            .any(|e| e.contains("410") || e.contains("too old")),
        "the server said 410: {errors:?}"
    );
    create(&vmis, "after").await;
    until(&mut stream, "a VMI created after the compaction", |e| {
        named(e, "after")
    })
    .await;
    assert_eq!(
        count(&metrics.relists, "expired"),
        1,
        "one re-list, counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_start_over_instead_of_retrying_forever() {
    let (env, client) = start().await;
    let metrics = WatchMetrics::default();
    let mut stream = Box::pin(virt_watch::watch(
        Api::<VirtualMachineInstance>::all(client.clone()),
        watcher::Config::default().timeout(1),
        "vmis",
        metrics.clone(),
    ));
    until(&mut stream, "the initial list", |e| {
        matches!(e, Event::InitDone)
    })
    .await;
    // Every request now fails: nothing listens on the server's port any more.
    let pid = env.apiserver_pid().expect("virt-apiserver runs");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut errors = 0;
    while count(&metrics.relists, "failures") == 0 {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Err(_))) => errors += 1,
            Ok(Some(Ok(_))) => {}
            Ok(None) => panic!("the watch stream ended"),
            Err(_) => panic!("no fresh list after {errors} errors in 60 s"),
        }
    }
    assert!(
        errors >= virt_watch::MAX_FAILURES as usize,
        "only after {} failures: {errors}",
        virt_watch::MAX_FAILURES
    );
    assert!(count(&metrics.errors, "") >= u64::from(virt_watch::MAX_FAILURES));

    // The fresh list fails too. Its watcher says `Init` before each list request: that is
    // no answer from the server, so the run of failures goes on (each further failure
    // starts over again, after the longest pause) instead of counting from zero with the
    // shortest pause — a watcher asking a dead server five times a second.
    for n in 1..=2 {
        loop {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(Some(Err(_))) => break,
                Ok(Some(Ok(_))) => {}
                Ok(None) => panic!("the watch stream ended"),
                Err(_) => panic!("no failure {n} of the fresh list within 60 s"),
            }
        }
    }
    assert_eq!(
        count(&metrics.relists, "failures"),
        3,
        "every failure of a fresh list that never answered starts over"
    );
}
