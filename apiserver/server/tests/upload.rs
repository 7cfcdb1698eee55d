//! CDI's upload path against a real etcd, a real kube-apiserver and the real virt-apiserver
//! binary with its upload proxy on: `upload.cdi.kubevirt.io/v1beta1` in discovery with the
//! create verb only; an UploadTokenRequest answered with a token and stored nowhere, refused
//! with a 422 for a claim that does not take uploads; the proxy answering HEAD for virtctl,
//! 400 without a token, 401 for a foreign or expired one, 403 for a claim that does not take
//! uploads, 503 while the claim's server is not ready, and streaming a qcow2 to the real
//! upload server (virt-importer's, in-process, standing in for the pod whose status the test
//! writes as kubelet would) so that the claim directory holds the converted disk.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{admin, json_of};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubevirt_api::cdi::annotations as ann;
use kubevirt_api::cdi::upload::TokenKey;
use serde_json::{Value, json};

const GV: &str = "/apis/upload.cdi.kubevirt.io/v1beta1";
const KEY: &[u8] = b"an upload token key of 32 bytes!";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn token_request(pvc: &str) -> Value {
    json!({"apiVersion": "upload.cdi.kubevirt.io/v1beta1", "kind": "UploadTokenRequest",
        "metadata": {"name": "token-for-virtctl"}, "spec": {"pvcName": pvc}})
}

/// A raw disk of a known pattern, and its qcow2.
fn images(dir: &std::path::Path) -> (Vec<u8>, Vec<u8>) {
    let mut raw = vec![0u8; 2 << 20];
    for (i, b) in raw.iter_mut().enumerate() {
        if (i / 4096) % 3 != 1 {
            *b = (i % 251) as u8 | 1;
        }
    }
    let (r, q) = (dir.join("d.raw"), dir.join("d.qcow2"));
    std::fs::write(&r, &raw).unwrap();
    let out = std::process::Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&r)
        .arg(&q)
        .output()
        .expect("qemu-img (Debian's qemu-utils)");
    assert!(out.status.success());
    (raw, std::fs::read(q).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_tokens_and_the_proxy_stream_an_image_into_the_claims_server() {
    let kube = kube_testenv::KubeApi::start("upload-token").await;
    let kc = kube.client.clone();
    let tmp = tempfile::tempdir().unwrap();
    let key_file = tmp.path().join("upload-token.key");
    std::fs::write(&key_file, KEY).unwrap();
    let proxy_port = free_port();
    let env = virt_devenv::DevEnv::start(virt_devenv::Options {
        apiserver_bin: env!("CARGO_BIN_EXE_virt-apiserver").into(),
        allow_client_ca_users: false,
        kube_kubeconfig: Some(kube.dir.path().join("kubeconfig")),
        extra_args: vec![
            format!("--upload-proxy-bind=127.0.0.1:{proxy_port}"),
            format!("--upload-token-key-file={}", key_file.display()),
        ],
        ..Default::default()
    })
    .expect("start etcd and virt-apiserver");
    let base = env.server_url.clone();
    let c = admin(&env);

    // Discovery: the group, create only.
    let (code, list) = json_of(c.get(format!("{base}{GV}")).send().await.unwrap()).await;
    assert_eq!(code, 200, "{list}");
    let r = &list["resources"][0];
    assert_eq!(r["name"], "uploadtokenrequests");
    assert_eq!(r["verbs"], json!(["create"]));
    assert_eq!(r["namespaced"], true);

    // The claims: one an upload target whose server is named, one plain.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(kc.clone(), "default");
    let claim = |name: &str, annotations: Value| -> PersistentVolumeClaim {
        serde_json::from_value(
            json!({"metadata": {"name": name, "annotations": annotations},
            "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "64Mi"}}}}),
        )
        .unwrap()
    };
    pvcs.create(
        &PostParams::default(),
        &claim(
            "disk",
            json!({ann::UPLOAD_TARGET: "", ann::UPLOAD_POD: "cdi-upload-disk"}),
        ),
    )
    .await
    .unwrap();
    pvcs.create(&PostParams::default(), &claim("plain", json!({})))
        .await
        .unwrap();

    // A token: answered 201, stored nowhere.
    let tokens = format!("{base}{GV}/namespaces/default/uploadtokenrequests");
    let (code, answer) = json_of(
        c.post(&tokens)
            .json(&token_request("disk"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 201, "{answer}");
    assert_eq!(answer["kind"], "UploadTokenRequest");
    let token = answer["status"]["token"].as_str().unwrap().to_string();
    let key = TokenKey::new(KEY);
    let claims = key.verify(&token, now()).unwrap();
    assert_eq!(
        (claims.namespace.as_str(), claims.pvc.as_str()),
        ("default", "disk")
    );
    let r = c.get(&tokens).send().await.unwrap();
    assert_eq!(r.status(), 405, "nothing to list");
    // A create's options are checked as any create's (found by `cargo xtask fuzz`).
    let r = c
        .post(format!("{tokens}?fieldValidation=AAA"))
        .json(&token_request("disk"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "a bad fieldValidation");
    // Not an upload target, missing, or no claim named: 422 saying what to do.
    for (pvc, words) in [
        ("plain", "is not an upload target"),
        ("gone", "not found"),
        ("", "spec.pvcName"),
    ] {
        let (code, status) = json_of(
            c.post(&tokens)
                .json(&token_request(pvc))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(code, 422, "{status}");
        assert!(
            status["message"].as_str().unwrap().contains(words),
            "{status}"
        );
    }

    // The proxy.
    let proxy = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let url = |path: &str| format!("https://127.0.0.1:{proxy_port}{path}");
    let send = |path: &str, token: Option<&str>, body: Vec<u8>| {
        let mut req = proxy
            .post(url(path))
            .header("Content-Type", "application/octet-stream")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    // virtctl's probe for the async path.
    let head = proxy
        .head(url("/v1beta1/upload-async"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 200);
    let (code, text) = send("/v1beta1/upload", None, b"x".to_vec()).await;
    assert_eq!(code, 400, "{text}");
    let foreign = TokenKey::new(b"someone else's key").sign("default", "disk", now());
    // A whole image behind a refused token: the proxy reads it before answering, so the
    // client gets the 401 rather than a reset connection mid-write.
    let (code, text) = send("/v1beta1/upload", Some(&foreign), vec![0; 8 << 20]).await;
    assert_eq!(code, 401, "{text}");
    let expired = key.sign("default", "disk", now() - 600);
    let (code, text) = send("/v1beta1/upload-async", Some(&expired), b"x".to_vec()).await;
    assert_eq!(code, 401, "{text}");
    assert!(text.contains("expired"), "{text}");
    let plain = key.sign("default", "plain", now());
    let (code, text) = send("/v1beta1/upload", Some(&plain), b"x".to_vec()).await;
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("default/plain"), "{text}");
    // No server pod yet: 503 (after the proxy's wait) naming the pod.
    let (code, text) = send("/v1beta1/upload", Some(&token), b"x".to_vec()).await;
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("cdi-upload-disk"), "{text}");

    // The claim's upload server: virt-importer's, on loopback, as the pod kubelet runs;
    // the pod object says where it listens and that it is ready.
    let server_port = free_port();
    let target = tempfile::tempdir().unwrap();
    let cfg = virt_importer::upload::UploadConfig {
        target: target.path().to_path_buf(),
        size: Some(8 << 20),
        scratch: None,
        progress_file: None,
        qemu_img: "qemu-img".into(),
    };
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], server_port)))
        .await
        .unwrap();
    let server = tokio::spawn(virt_importer::upload::serve(cfg, listener));
    // kube-apiserver's ServiceAccount admission wants the namespace's account (no
    // controller-manager makes it here).
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(kc.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(kc.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "cdi-upload-disk"},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "cdi-upload-server", "image": "x",
            "ports": [{"name": "upload", "containerPort": server_port}]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        "cdi-upload-disk",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True"}]}})),
    )
    .await
    .unwrap();

    let img = tempfile::tempdir().unwrap();
    let (raw, qcow2) = images(img.path());
    let (code, text) = send("/v1beta1/upload-async", Some(&token), qcow2).await;
    assert_eq!(code, 200, "{text}");
    let outcome = tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(outcome.format.name(), "qcow2");
    let disk = std::fs::read(target.path().join("disk.img")).unwrap();
    assert_eq!(disk.len(), 8 << 20);
    assert_eq!(&disk[..raw.len()], &raw[..]);
    assert!(disk[raw.len()..].iter().all(|b| *b == 0));

    // Done (virt-controller marks the claim): a second upload is refused with 409.
    pvcs.patch(
        "disk",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ann::POD_PHASE: "Succeeded"}}})),
    )
    .await
    .unwrap();
    let (code, text) = send("/v1beta1/upload", Some(&token), b"x".to_vec()).await;
    assert_eq!(code, 409, "{text}");
}
