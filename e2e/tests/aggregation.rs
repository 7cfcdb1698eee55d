//! The cluster's aggregation layer: an APIService backed by a pod becomes Available, and requests
//! through kube-apiserver reach the pod with the front-proxy client certificate and the caller's
//! identity in X-Remote-User/X-Remote-Group — what virt-apiserver relies on.
//!
//! Needs root, Go (to build `e2e/k8s/cmd/aggregation-probe`) and the packages of
//! docs/local-cluster.md. Run with `cargo test -p e2e -- --ignored`.

use std::time::Duration;

use e2e::{Cluster, go_program, scratch_image};

const MANIFESTS: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: aggregation-probe
  namespace: kube-system
  labels: {app: aggregation-probe}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: probe
    image: IMAGE
    imagePullPolicy: Never
    args: ["-requestheader-ca=/ca/requestheader-client-ca-file"]
    volumeMounts: [{name: ca, mountPath: /ca}]
  volumes:
  - name: ca
    configMap: {name: extension-apiserver-authentication}
---
apiVersion: v1
kind: Service
metadata: {name: aggregation-probe, namespace: kube-system}
spec:
  selector: {app: aggregation-probe}
  ports: [{port: 443, targetPort: 8443}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1.probe.kubevirt.io}
spec:
  group: probe.kubevirt.io
  version: v1
  groupPriorityMinimum: 1000
  versionPriority: 15
  insecureSkipTLSVerify: true
  service: {name: aggregation-probe, namespace: kube-system, port: 443}
"#;

fn delete_all(c: &Cluster) {
    let _ = c.kubectl(&[
        "delete",
        "apiservice",
        "v1.probe.kubevirt.io",
        "--ignore-not-found",
    ]);
    let _ = c.kubectl(&[
        "-n",
        "kube-system",
        "delete",
        "service,pod",
        "aggregation-probe",
        "--ignore-not-found",
        "--wait=false",
    ]);
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn aggregated_api_receives_front_proxy_identity() {
    let c = Cluster::get().expect("cluster");
    let dir = std::env::temp_dir().join(format!("e2e-aggregation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let probe = go_program("./cmd/aggregation-probe", &dir).expect("build probe");
    let image = format!("localhost/e2e/aggregation-probe:{}", std::process::id());
    let archive = scratch_image(&image, &[(probe.as_path(), "/probe")], &["/probe"], &dir)
        .expect("probe image");
    c.load_image(&archive).expect("load image");
    let _ = std::fs::remove_dir_all(&dir);

    delete_all(c);
    c.eventually("old probe pod gone", Duration::from_secs(30), || {
        Ok(c.kubectl(&[
            "-n",
            "kube-system",
            "get",
            "pod",
            "aggregation-probe",
            "--ignore-not-found",
        ])?
        .trim()
        .is_empty())
    })
    .expect("cleanup");
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&MANIFESTS.replace("IMAGE", &image)),
    )
    .expect("apply");

    let available = r#"jsonpath={.status.conditions[?(@.type=="Available")].status}"#;
    let result = c
        .eventually("APIService Available", Duration::from_secs(90), || {
            Ok(
                c.kubectl(&["get", "apiservice", "v1.probe.kubevirt.io", "-o", available])?
                    .trim()
                    == "True",
            )
        })
        .and_then(|()| c.kubectl(&["get", "--raw", "/apis/probe.kubevirt.io/v1/echoes/hello"]));
    let diagnosis = c
        .kubectl(&["get", "apiservice", "v1.probe.kubevirt.io", "-o", "yaml"])
        .unwrap_or_default();
    delete_all(c);
    let echo: serde_json::Value =
        serde_json::from_str(&result.unwrap_or_else(|e| panic!("{e:#}\n{diagnosis}")))
            .expect("echo JSON");

    assert_eq!(echo["metadata"]["name"], "hello");
    assert_eq!(echo["clientCertCN"], "front-proxy-client", "{echo}");
    assert_eq!(
        echo["clientCertValid"], true,
        "front-proxy certificate must verify: {echo}"
    );
    // The identity is our kubeconfig's: only the local cluster's admin is known by name,
    // so on another cluster this test fails rather than checking less.
    assert!(
        c.local,
        "the identity check needs the local cluster (KUBECONFIG=target/cluster/kubeconfig)"
    );
    assert_eq!(echo["user"], "kubernetes-admin", "{echo}");
    let groups = echo["groups"].as_array().cloned().unwrap_or_default();
    assert!(groups.iter().any(|g| g == "system:masters"), "{echo}");
}
