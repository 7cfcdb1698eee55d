//! The cluster itself: the node is Ready and a pod from a locally built image runs.
//!
//! Needs root and the packages of docs/local-cluster.md; uses the cluster named by KUBECONFIG
//! or brings the local one up. Run with `cargo test -p e2e -- --ignored`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use e2e::{Cluster, busybox_image};

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn node_is_ready() {
    let c = Cluster::get().expect("cluster");
    let jsonpath = r#"jsonpath={.items[*].status.conditions[?(@.type=="Ready")].status}"#;
    // Every node (the local cluster may have two).
    c.eventually("every node Ready", Duration::from_secs(60), || {
        let statuses = c.kubectl(&["get", "nodes", "-o", jsonpath])?;
        let mut all = statuses.split_whitespace().peekable();
        Ok(all.peek().is_some() && all.all(|s| s == "True"))
    })
    .expect("nodes Ready");
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn pod_from_local_image_runs() {
    let c = Cluster::get().expect("cluster");
    let dir = std::env::temp_dir().join(format!("e2e-busybox-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // A fresh tag per run: proves the image came from this run's import, not from a cache.
    let tag = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let image = format!("localhost/e2e/busybox:{tag}");
    let archive = busybox_image(&image, &dir).expect("build busybox image");
    c.load_image(&archive).expect("load image");
    let _ = std::fs::remove_dir_all(&dir);

    let ns = format!("e2e-pod-{tag}");
    c.kubectl(&["create", "namespace", &ns]).expect("namespace");
    let pod = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"busybox","namespace":"{ns}"}},
        "spec":{{"terminationGracePeriodSeconds":0,"containers":[{{"name":"busybox","image":"{image}",
        "imagePullPolicy":"Never","args":["sh","-c","echo ready; exec sleep 3600"]}}]}}}}"#
    );
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&pod))
        .expect("create pod");
    let result = c.eventually("pod Running", Duration::from_secs(60), || {
        let phase = c.kubectl(&[
            "-n",
            &ns,
            "get",
            "pod",
            "busybox",
            "-o",
            "jsonpath={.status.phase}",
        ])?;
        Ok(phase == "Running")
    });
    // Logs come from kubelet through kube-apiserver: the node's streaming path works too.
    let logs = result.and_then(|()| {
        c.eventually("pod logs", Duration::from_secs(20), || {
            Ok(c.kubectl(&["-n", &ns, "logs", "busybox"])?.trim() == "ready")
        })
    });
    let _ = c.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    logs.expect("pod Running with its logs");
}
