#![allow(clippy::unwrap_used, clippy::expect_used)]

//! virt-apiserver's own authorization against a real kube-apiserver: requests that reach
//! it through a front proxy are checked with SubjectAccessReview (RBAC decides), and
//! only `system:masters` skips the check.

use std::process::Command;

use e2e::{Cluster, workspace_root};
use virt_devenv::{DevEnv, Options};

fn apiserver_binary() -> std::path::PathBuf {
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "-q",
            "-p",
            "virt-apiserver",
            "--bin",
            "virt-apiserver",
        ])
        .current_dir(workspace_root())
        .status()
        .expect("cargo build");
    assert!(status.success(), "building virt-apiserver");
    workspace_root().join("target/debug/virt-apiserver")
}

async fn list_as(env: &DevEnv, user: &str, groups: &[&str]) -> (u16, String) {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&env.server_ca).unwrap()).unwrap();
    let mut pem = std::fs::read(&env.front_proxy.cert).unwrap();
    pem.extend(std::fs::read(&env.front_proxy.key).unwrap());
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .use_rustls_tls()
        .build()
        .unwrap();
    let mut req = client
        .get(format!(
            "{}/apis/kubevirt.io/v1/namespaces/default/virtualmachines",
            env.server_url
        ))
        .header("X-Remote-User", user);
    for g in groups {
        req = req.header("X-Remote-Group", *g);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
async fn subject_access_review_decides() {
    let c = Cluster::get().expect("cluster");
    let env = DevEnv::start(Options {
        apiserver_bin: apiserver_binary(),
        allow_client_ca_users: false,
        kube_kubeconfig: Some(c.kubeconfig.clone()),
        ..Default::default()
    })
    .expect("virt-apiserver against the cluster");

    let (code, body) = list_as(&env, "e2e-nobody", &["e2e-team"]).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("User \\\"e2e-nobody\\\" cannot list resource \\\"virtualmachines\\\""),
        "{body}"
    );

    let role = r#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"e2e-vm-reader","namespace":"default"},
        "rules":[{"apiGroups":["kubevirt.io"],"resources":["virtualmachines"],"verbs":["get","list","watch"]}]}"#;
    let binding = r#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"e2e-vm-reader","namespace":"default"},
        "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"e2e-vm-reader"},
        "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"e2e-reader"}]}"#;
    c.kubectl_stdin(&["apply", "-f", "-"], Some(role))
        .expect("role");
    c.kubectl_stdin(&["apply", "-f", "-"], Some(binding))
        .expect("binding");
    let (code, body) = list_as(&env, "e2e-reader", &[]).await;
    assert_eq!(code, 200, "{body}");
    // A group grant works the same way; system:masters needs no review at all.
    let (code, _) = list_as(&env, "someone", &["system:masters"]).await;
    assert_eq!(code, 200);
    let _ = c.kubectl(&[
        "delete",
        "rolebinding,role",
        "e2e-vm-reader",
        "-n",
        "default",
    ]);
}
