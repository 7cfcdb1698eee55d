//! virt-apiserver on a three-member etcd cluster over TLS, the members talking peer TLS with
//! the flags virt-operator gives them (virt_devenv): with one member killed — the leader, the
//! hardest case for writes — creates, reads, lists and an open watch go on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use virt_devenv::{DevEnv, Options};

use common::{VMS, admin, vm};

fn start() -> DevEnv {
    DevEnv::start(Options {
        apiserver_bin: env!("CARGO_BIN_EXE_virt-apiserver").into(),
        etcd_members: 3,
        etcd_tls: true,
        ..Default::default()
    })
    .expect("start three etcd members and virt-apiserver (is Debian's etcd-server installed?)")
}

/// The index of the member that leads the cluster now.
async fn leader(env: &DevEnv) -> usize {
    let t = env.etcd_tls.as_ref().expect("etcd TLS");
    let read = |p: &std::path::Path| std::fs::read_to_string(p).expect("etcd TLS file");
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(&t.ca)))
        .identity(etcd_client::Identity::from_pem(
            read(&t.client.cert),
            read(&t.client.key),
        ));
    let mut ids = Vec::new();
    let mut leader = 0;
    for url in &env.etcd_urls {
        let mut c = etcd_client::Client::connect(
            [url],
            Some(etcd_client::ConnectOptions::new().with_tls(tls.clone())),
        )
        .await
        .expect("connect to an etcd member");
        let st = c.status().await.expect("etcd status");
        ids.push(st.header().expect("header").member_id());
        leader = st.leader();
    }
    ids.iter()
        .position(|id| *id == leader)
        .expect("the leader is one of the members")
}

/// The end of virt-apiserver's log, for a failure's message.
fn log_tail(env: &DevEnv) -> String {
    let log = std::fs::read_to_string(&env.apiserver_log).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

async fn create(env: &DevEnv, c: &reqwest::Client, url: &str, name: &str) {
    let resp = c.post(url).json(&vm(name)).send().await.expect("POST");
    let code = resp.status();
    let body = resp.text().await.unwrap_or_default();
    assert_eq!(code, 201, "creating {name}: {body}\n{}", log_tail(env));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_one_etcd_member_killed_writes_reads_and_watches_go_on() {
    let mut env = start();
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    for i in 0..5 {
        create(&env, &c, &url, &format!("before-{i}")).await;
    }
    let list: Value = c
        .get(&url)
        .send()
        .await
        .expect("LIST")
        .json()
        .await
        .expect("list body");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("list resourceVersion")
        .to_string();

    // One watch, opened before the kill, must deliver every later create on the same stream.
    let (tx, mut added) = tokio::sync::mpsc::unbounded_channel::<Option<String>>();
    let watch = c
        .get(format!("{url}?watch=1&resourceVersion={rv}"))
        .send()
        .await
        .expect("WATCH");
    assert_eq!(watch.status(), 200);
    tokio::spawn(async move {
        let mut body = watch.bytes_stream();
        let mut buf = Vec::new();
        while let Some(Ok(chunk)) = body.next().await {
            buf.extend_from_slice(&chunk);
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let ev: Value = serde_json::from_slice(&line).unwrap_or_default();
                if ev["type"] == "ADDED" {
                    let name = ev["object"]["metadata"]["name"].as_str().map(String::from);
                    let _ = tx.send(name);
                } else {
                    eprintln!("watch event: {ev}");
                }
            }
        }
        // The stream ended: say so, the test fails on it.
        let _ = tx.send(None);
    });

    let killed = leader(&env).await;
    env.kill_etcd_member(killed);
    let start = Instant::now();
    const AFTER: usize = 20;
    for i in 0..AFTER {
        create(&env, &c, &url, &format!("after-{i}")).await;
    }
    eprintln!(
        "{AFTER} creates after killing etcd member {killed} (the leader): {:?}",
        start.elapsed()
    );
    for i in 0..AFTER {
        let r = c.get(format!("{url}/after-{i}")).send().await.expect("GET");
        assert_eq!(r.status(), 200, "after-{i}\n{}", log_tail(&env));
    }
    let list: Value = c
        .get(&url)
        .send()
        .await
        .expect("LIST")
        .json()
        .await
        .expect("list body");
    assert_eq!(
        list["items"].as_array().map(Vec::len),
        Some(5 + AFTER),
        "{list}"
    );
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < AFTER {
        match tokio::time::timeout(Duration::from_secs(30), added.recv()).await {
            Ok(Some(Some(name))) => {
                if name.starts_with("after-") {
                    seen.insert(name);
                }
            }
            Ok(Some(None)) | Ok(None) => panic!(
                "the watch ended after {} of {AFTER} creates; virt-apiserver log:\n{}",
                seen.len(),
                log_tail(&env)
            ),
            Err(_) => panic!(
                "the watch delivered {} of {AFTER} creates in 30 s; virt-apiserver log:\n{}",
                seen.len(),
                log_tail(&env)
            ),
        }
    }
    let ready = c
        .get(format!("{}/readyz", env.server_url))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);
}
