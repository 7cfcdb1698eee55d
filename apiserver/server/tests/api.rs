//! HTTP-level API contract tests against a real virt-apiserver and etcd.

mod common;
use common::json_of;

use std::time::Duration;

use common::{VMS, admin, client, vm};
use futures::StreamExt;
use serde_json::{Value, json};

/// The server's `/metrics` text (a failed scrape fails the test).
#[allow(clippy::unwrap_used)]
async fn metrics_text(c: &reqwest::Client, env: &virt_devenv::DevEnv) -> String {
    c.get(format!("{}/metrics", env.server_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_exact_status_and_nothing_is_stored() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    let post =
        |body: String, ct: &'static str| c.post(&url).header("Content-Type", ct).body(body).send();

    let (code, s) = json_of(post("{not json".into(), "application/json").await.unwrap()).await;
    assert_eq!((code, s["reason"].as_str()), (400, Some("BadRequest")));
    let (code, _) = json_of(post("a: [b".into(), "application/yaml").await.unwrap()).await;
    assert_eq!(code, 400);

    let mut unknown = vm("u");
    unknown["spec"]["foo"] = json!(1);
    let r = c
        .post(format!("{url}?fieldValidation=Strict"))
        .json(&unknown)
        .send()
        .await
        .unwrap();
    let (code, s) = json_of(r).await;
    assert_eq!(code, 400);
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("unknown field \"spec.foo\""),
        "{s}"
    );

    let mut strategy = vm("s");
    strategy["spec"]["runStrategy"] = json!("Sometimes");
    let (code, s) = json_of(c.post(&url).json(&strategy).send().await.unwrap()).await;
    assert_eq!((code, s["reason"].as_str()), (422, Some("Invalid")));
    assert_eq!(s["details"]["causes"][0]["field"], "spec.runStrategy");
    assert_eq!(
        s["details"]["causes"][0]["reason"],
        "FieldValueNotSupported"
    );

    let mut eviction = vm("e");
    eviction["spec"]["template"]["spec"]["evictionStrategy"] = json!("Migrate");
    let (code, s) = json_of(c.post(&url).json(&eviction).send().await.unwrap()).await;
    assert_eq!((code, s["reason"].as_str()), (422, Some("Invalid")));
    assert_eq!(
        s["details"]["causes"][0]["field"],
        "spec.template.spec.evictionStrategy"
    );
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("LiveMigrateIfPossible"),
        "names the supported values: {s}"
    );

    let mut memory = vm("m");
    memory["spec"]["template"]["spec"]["domain"]["resources"]["requests"]["memory"] = json!("lots");
    let (code, s) = json_of(c.post(&url).json(&memory).send().await.unwrap()).await;
    assert_eq!(code, 422);
    assert_eq!(
        s["details"]["causes"][0]["field"],
        "spec.template.spec.domain.resources.requests.memory"
    );

    let mut missing_volume = vm("mv");
    missing_volume["spec"]["template"]["spec"]["volumes"] = json!([]);
    let (code, s) = json_of(c.post(&url).json(&missing_volume).send().await.unwrap()).await;
    assert_eq!(code, 422);
    assert_eq!(
        s["details"]["causes"][0]["field"],
        "spec.template.spec.domain.devices.disks[0].name"
    );

    let mut version = vm("v");
    version["apiVersion"] = json!("kubevirt.io/v2");
    assert_eq!(
        c.post(&url).json(&version).send().await.unwrap().status(),
        400
    );
    let mut kind = vm("k");
    kind["kind"] = json!("VirtualMachineInstance");
    assert_eq!(c.post(&url).json(&kind).send().await.unwrap().status(), 400);

    let (code, s) = json_of(
        c.post(&url)
            .json(&vm(&"a".repeat(254)))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(s["details"]["causes"][0]["field"], "metadata.name");
    assert_eq!(
        c.post(&url)
            .json(&vm("Not_DNS"))
            .send()
            .await
            .unwrap()
            .status(),
        422
    );

    let mut ns = vm("n");
    ns["metadata"]["namespace"] = json!("other");
    assert_eq!(c.post(&url).json(&ns).send().await.unwrap().status(), 400);

    let mut huge = vm("h");
    huge["metadata"]["annotations"] = json!({"big": "x".repeat(4 * 1024 * 1024)});
    let (code, s) = json_of(c.post(&url).json(&huge).send().await.unwrap()).await;
    assert_eq!(
        (code, s["reason"].as_str()),
        (413, Some("RequestEntityTooLarge"))
    );

    let r = c
        .post(&url)
        .header("Content-Type", "text/plain")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);

    let (code, list) = json_of(c.get(&url).send().await.unwrap()).await;
    assert_eq!(code, 200);
    assert_eq!(
        list["items"],
        json!([]),
        "nothing may be stored by failed requests"
    );
    assert_eq!(list["kind"], "VirtualMachineList");

    let (code, s) = json_of(c.get(format!("{url}/nope")).send().await.unwrap()).await;
    assert_eq!(
        (code, s["message"].as_str()),
        (404, Some("virtualmachines.kubevirt.io \"nope\" not found"))
    );
    // A wrong method is a 405 that names the methods the path serves.
    let r = c
        .post(format!("{url}/x"))
        .json(&vm("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, PUT, PATCH, DELETE");
    let r = c
        .request(reqwest::Method::TRACE, &url)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), &r.headers()["allow"]),
        (405, &"GET, POST, DELETE".parse().unwrap())
    );
    let (code, _) = json_of(c.get(format!("{url}?limit=abc")).send().await.unwrap()).await;
    assert_eq!(code, 400);
    // A boolean that is neither true nor false names itself (kube-apiserver would take it
    // as true and start a watch the client did not ask for).
    for (query, param) in [
        ("watch=maybe", "watch"),
        ("timeoutSeconds=soon", "timeoutSeconds"),
    ] {
        let (code, s) = json_of(c.get(format!("{url}?{query}")).send().await.unwrap()).await;
        assert_eq!(code, 400, "{s}");
        assert!(s["message"].as_str().unwrap().contains(param), "{s}");
    }

    // A JSON patch copy bomb (each copy doubles the spec) is refused once the copies pass
    // kube-apiserver's 3 MiB, and the stored object is untouched.
    let mut target = vm("bomb");
    target["metadata"]["annotations"] = json!({"pad": "x".repeat(64 * 1024)});
    let (code, created) = json_of(c.post(&url).json(&target).send().await.unwrap()).await;
    assert_eq!(code, 201, "{created}");
    let bomb: Vec<Value> = (0..30)
        .map(|i| json!({"op": "copy", "from": "/metadata/annotations", "path": format!("/metadata/annotations/c{i}")}))
        .collect();
    let r = c
        .patch(format!("{url}/bomb"))
        .header("Content-Type", "application/json-patch+json")
        .json(&bomb)
        .send()
        .await
        .unwrap();
    let (code, s) = json_of(r).await;
    assert_eq!(
        (code, s["reason"].as_str()),
        (413, Some("RequestEntityTooLarge")),
        "{s}"
    );
    assert!(
        s["message"]
            .as_str()
            .unwrap_or("")
            .contains("copies more than"),
        "{s}"
    );
    let (_, stored) = json_of(c.get(format!("{url}/bomb")).send().await.unwrap()).await;
    assert_eq!(
        stored["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );
    // Copies within the bound are an ordinary patch.
    let r = c
        .patch(format!("{url}/bomb"))
        .header("Content-Type", "application/json-patch+json")
        .json(&json!([{"op": "copy", "from": "/metadata/annotations/pad", "path": "/metadata/annotations/pad2"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Without kube-apiserver `kubevirts` is not found, even for a client still sending a
    // large body: the answer, not a reset connection (schemathesis found it), and the
    // connection goes on.
    let kv = format!(
        "{}/apis/kubevirt.io/v1/namespaces/d/kubevirts",
        env.server_url
    );
    for _ in 0..2 {
        let r = c
            .post(&kv)
            .header("Content-Type", "application/json")
            .body(format!("{{\"pad\": \"{}\"}}", "x".repeat(2 << 20)))
            .send()
            .await
            .expect("an answer, not a reset connection");
        assert_eq!(r.status(), 404);
    }
    // A collection delete's list parameters are typed, body or not.
    let (code, s) = json_of(
        c.delete(format!("{url}?sendInitialEvents=null"))
            .json(&json!({"propagationPolicy": null}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 400, "{s}");
    assert!(
        s["message"].as_str().unwrap().contains("sendInitialEvents"),
        "{s}"
    );
    // Delete options in the query are checked even beside a body (whose options win).
    for (q, want) in [
        ("propagationPolicy=AAA", 422),
        ("gracePeriodSeconds=x", 400),
        ("dryRun=x", 422),
    ] {
        let r = c
            .delete(format!("{url}?{q}"))
            .json(&json!({"propagationPolicy": "Background"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), want, "{q}");
    }
    // A DeleteOptions' type fields are strings.
    let r = c
        .delete(&url)
        .json(&json!({"kind": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // dryRun is All or absent (kube-apiserver's rule; the published schema's enum).
    let (code, s) = json_of(
        c.post(format!("{url}?dryRun="))
            .json(&vm("dry"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (code, s["details"]["causes"][0]["field"].as_str()),
        (422, Some("dryRun"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn security_is_on_by_default() {
    let env = common::start(false);
    let url = format!("{}{VMS}", env.server_url);

    // No certificate: 401, but probes stay open.
    let anon = client(&env, None);
    let (code, s) = json_of(anon.get(&url).send().await.unwrap()).await;
    assert_eq!((code, s["reason"].as_str()), (401, Some("Unauthorized")));
    assert_eq!(
        anon.get(format!("{}/readyz", env.server_url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        anon.get(format!("{}/healthz?verbose", env.server_url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            .lines()
            .last(),
        Some("healthz check passed")
    );

    // A certificate from a CA the server does not trust: 401 (even claiming system:masters).
    let other = client(&env, Some(&env.untrusted));
    assert_eq!(other.get(&url).send().await.unwrap().status(), 401);
    let spoof = other
        .get(&url)
        .header("X-Remote-User", "admin")
        .header("X-Remote-Group", "system:masters");
    assert_eq!(spoof.send().await.unwrap().status(), 401);

    // A client-CA user cannot become someone else with X-Remote-* headers.
    let alice = client(&env, Some(&env.plain_user));
    let r = alice
        .get(&url)
        .header("X-Remote-User", "admin")
        .header("X-Remote-Group", "system:masters")
        .send()
        .await
        .unwrap();
    let (code, s) = json_of(r).await;
    assert_eq!(code, 403, "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("User \"alice\" cannot list resource \"virtualmachines\""),
        "{s}"
    );

    // The front proxy's certificate makes the headers trusted.
    let proxy = client(&env, Some(&env.front_proxy));
    let r = proxy
        .get(&url)
        .header("X-Remote-User", "bob")
        .header("X-Remote-Group", "system:masters")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = proxy
        .get(&url)
        .header("X-Remote-User", "bob")
        .send()
        .await
        .unwrap();
    let (code, s) = json_of(r).await;
    assert_eq!(code, 403);
    assert!(
        s["message"].as_str().unwrap().contains("User \"bob\""),
        "{s}"
    );
    // Discovery is open to every authenticated user (the aggregator's probe path).
    assert_eq!(
        alice
            .get(format!("{}/apis/kubevirt.io/v1", env.server_url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_read_modify_write_loses_nothing_and_watch_sees_every_revision() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    let (code, created) = json_of(c.post(&url).json(&vm("counter")).send().await.unwrap()).await;
    assert_eq!(code, 201);
    let start_rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    // Enough writers that they collide on every round; each success costs about WRITERS
    // conflicting round trips, so more writers only make this slower (32 took 200 s).
    const WRITERS: usize = 8;
    const UPDATES: usize = 40;
    let watch_url =
        format!("{url}?watch=1&resourceVersion={start_rv}&fieldSelector=metadata.name%3Dcounter");
    let watcher = tokio::spawn({
        let c = c.clone();
        async move {
            let resp = c.get(watch_url).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            let mut body = resp.bytes_stream();
            let mut buf = Vec::new();
            let mut seen: Vec<(i64, i64)> = Vec::new();
            while seen.len() < WRITERS * UPDATES {
                let chunk = match tokio::time::timeout(Duration::from_secs(60), body.next()).await {
                    Ok(Some(Ok(c))) => c,
                    other => {
                        eprintln!("watch ended after {} events: {other:?}", seen.len());
                        return seen;
                    }
                };
                buf.extend_from_slice(&chunk);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    let ev: Value = serde_json::from_slice(&line).unwrap();
                    let rv: i64 = ev["object"]["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap()
                        .parse()
                        .unwrap();
                    let n: i64 = ev["object"]["metadata"]["annotations"]["count"]
                        .as_str()
                        .unwrap()
                        .parse()
                        .unwrap();
                    seen.push((rv, n));
                }
            }
            seen
        }
    });
    let obj_url = format!("{url}/counter");
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let c = c.clone();
        let obj_url = obj_url.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0;
            for _ in 0..UPDATES {
                loop {
                    let mut cur: Value =
                        c.get(&obj_url).send().await.unwrap().json().await.unwrap();
                    let n: i64 = cur["metadata"]["annotations"]["count"]
                        .as_str()
                        .unwrap_or("0")
                        .parse()
                        .unwrap();
                    cur["metadata"]["annotations"] = json!({"count": (n + 1).to_string()});
                    let r = c.put(&obj_url).json(&cur).send().await.unwrap();
                    match r.status().as_u16() {
                        200 => break,
                        409 => conflicts += 1,
                        other => panic!("unexpected {other}: {}", r.text().await.unwrap()),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.unwrap();
    }
    let fin: Value = c.get(&obj_url).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        fin["metadata"]["annotations"]["count"],
        json!((WRITERS * UPDATES).to_string())
    );
    assert!(
        conflicts > 0,
        "{WRITERS} concurrent writers must have collided at least once"
    );
    let seen = tokio::time::timeout(Duration::from_secs(60), watcher)
        .await
        .unwrap()
        .unwrap();
    if seen.len() != WRITERS * UPDATES {
        let log = std::fs::read_to_string(&env.apiserver_log).unwrap_or_default();
        eprintln!(
            "server log tail:\n{}",
            log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
    }
    assert_eq!(seen.len(), WRITERS * UPDATES);
    for (i, w) in seen.windows(2).enumerate() {
        assert!(w[1].0 > w[0].0, "revisions out of order at {i}");
        assert_eq!(w[1].1, w[0].1 + 1, "watch skipped a revision at {i}");
    }
    assert_eq!(seen[0].1, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_generation_finalizers_and_dry_run() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    let mut body = vm("s1");
    body["status"] = json!({"printableStatus": "Running"});
    let (code, created) = json_of(c.post(&url).json(&body).send().await.unwrap()).await;
    assert_eq!(code, 201);
    assert!(
        created.get("status").is_none(),
        "status is dropped on create"
    );
    assert_eq!(created["metadata"]["generation"], 1);

    // PUT /status changes only status, keeps generation.
    let mut st = created.clone();
    st["spec"]["runStrategy"] = json!("Always");
    st["status"] = json!({"printableStatus": "Stopped"});
    let (code, after) = json_of(
        c.put(format!("{url}/s1/status"))
            .json(&st)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(after["spec"]["runStrategy"], "Halted");
    assert_eq!(after["status"]["printableStatus"], "Stopped");
    assert_eq!(after["metadata"]["generation"], 1);

    // PUT main resource changes spec only, bumps generation.
    let mut main = after.clone();
    main["spec"]["runStrategy"] = json!("Always");
    main["status"] = json!({"printableStatus": "Running"});
    let (code, after) = json_of(c.put(format!("{url}/s1")).json(&main).send().await.unwrap()).await;
    assert_eq!(code, 200);
    assert_eq!(after["spec"]["runStrategy"], "Always");
    assert_eq!(after["status"]["printableStatus"], "Stopped");
    assert_eq!(after["metadata"]["generation"], 2);

    // A no-op write keeps the resourceVersion.
    let (_, same) = json_of(
        c.put(format!("{url}/s1"))
            .json(&after)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        same["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );

    // dryRun stores nothing.
    let (code, dry) = json_of(
        c.post(format!("{url}?dryRun=All"))
            .json(&vm("dry"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 201);
    assert!(dry["metadata"]["uid"].is_string());
    assert_eq!(
        c.get(format!("{url}/dry")).send().await.unwrap().status(),
        404
    );

    // generateName.
    let mut gen_vm = vm("");
    gen_vm["metadata"] = json!({"generateName": "gen-"});
    let (code, g) = json_of(c.post(&url).json(&gen_vm).send().await.unwrap()).await;
    assert_eq!(code, 201);
    assert!(g["metadata"]["name"].as_str().unwrap().starts_with("gen-"));
    // AlreadyExists.
    let (code, s) = json_of(c.post(&url).json(&vm("s1")).send().await.unwrap()).await;
    assert_eq!((code, s["reason"].as_str()), (409, Some("AlreadyExists")));

    // Finalizers: delete marks, removing the finalizer removes the object.
    let mut f = vm("fin");
    f["metadata"]["finalizers"] = json!(["example.com/x"]);
    c.post(&url).json(&f).send().await.unwrap();
    let (code, pending) = json_of(c.delete(format!("{url}/fin")).send().await.unwrap()).await;
    assert_eq!(code, 200);
    assert!(pending["metadata"]["deletionTimestamp"].is_string());
    let add = c
        .patch(format!("{url}/fin"))
        .header("Content-Type", "application/merge-patch+json")
        .body(r#"{"metadata":{"finalizers":["example.com/x","example.com/y"]}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(add.status(), 422, "no new finalizers while deleting");
    let rm = c
        .patch(format!("{url}/fin"))
        .header("Content-Type", "application/merge-patch+json")
        .body(r#"{"metadata":{"finalizers":null}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(rm.status(), 200);
    assert_eq!(
        c.get(format!("{url}/fin")).send().await.unwrap().status(),
        404
    );

    // Preconditions.
    let del = c
        .delete(format!("{url}/s1"))
        .json(&json!({"preconditions": {"uid": "wrong"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 409);
    let (code, s) = json_of(c.delete(format!("{url}/s1")).send().await.unwrap()).await;
    assert_eq!((code, s["status"].as_str()), (200, Some("Success")));

    // deletecollection with a selector.
    for n in ["a1", "a2", "b1"] {
        let mut v = vm(n);
        v["metadata"]["labels"] = json!({"grp": &n[..1]});
        c.post(&url).json(&v).send().await.unwrap();
    }
    assert_eq!(
        c.delete(format!("{url}?labelSelector=grp%3Da"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let (_, list) = json_of(
        c.get(format!("{url}?labelSelector=grp"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["b1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paging_watch_resume_bookmarks_and_compaction() {
    // A watch cache of 2 events, so that the compacted version below is older than the
    // cache and etcd answers it (the cache serves versions it holds even once compacted).
    let env = common::start_with(&["--watch-cache-history=2"]);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    for i in 0..7 {
        c.post(&url)
            .json(&vm(&format!("p{i}")))
            .send()
            .await
            .unwrap();
    }
    let (_, page1) = json_of(c.get(format!("{url}?limit=3")).send().await.unwrap()).await;
    assert_eq!(page1["items"].as_array().unwrap().len(), 3);
    let token = page1["metadata"]["continue"].as_str().unwrap().to_string();
    assert_eq!(page1["metadata"]["remainingItemCount"], 4);
    c.post(&url).json(&vm("p9")).send().await.unwrap();
    let (_, page2) = json_of(
        c.get(format!("{url}?limit=10&continue={token}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let names: Vec<&str> = page2["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["p3", "p4", "p5", "p6"],
        "continue reads the first page's snapshot"
    );

    // Table and metadata-only lists.
    let t: Value = c
        .get(&url)
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["rows"].as_array().unwrap().len(), 8);
    let m: Value = c
        .get(&url)
        .header(
            "Accept",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m["kind"], "PartialObjectMetadataList");
    assert!(m["items"][0].get("spec").is_none());

    // WatchList: initial events, then the annotated bookmark.
    let r = c
        .get(format!("{url}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=5"))
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.iter().filter(|e| e["type"] == "ADDED").count(), 8);
    let end = events
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("initial-events-end bookmark");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // A filtered watch: an object that stops matching is DELETED with its previous state.
    let (_, now_list) = json_of(c.get(format!("{url}?limit=1")).send().await.unwrap()).await;
    let from = now_list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut stream = c
        .get(format!(
            "{url}?watch=1&resourceVersion={from}&labelSelector=app%3Ddemo&timeoutSeconds=3"
        ))
        .send()
        .await
        .unwrap()
        .bytes_stream();
    let r = c
        .patch(format!("{url}/p0"))
        .header("Content-Type", "application/merge-patch+json")
        .body(r#"{"metadata":{"labels":{"app":"other"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut text = String::new();
    while let Some(Ok(chunk)) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let ev: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(ev["type"], "DELETED", "{text}");
    assert_eq!(
        ev["object"]["metadata"]["labels"]["app"], "demo",
        "previous state: {text}"
    );
    assert_ne!(
        ev["object"]["metadata"]["resourceVersion"].as_str(),
        Some(from.as_str())
    );

    // sendInitialEvents without resourceVersionMatch is refused before streaming.
    assert_eq!(
        c.get(format!("{url}?watch=1&sendInitialEvents=true"))
            .send()
            .await
            .unwrap()
            .status(),
        422
    );

    // Compaction: an old continue token and an old watch start are 410.
    let rv: i64 = page2["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    for i in 0..3 {
        c.post(&url)
            .json(&vm(&format!("q{i}")))
            .send()
            .await
            .unwrap();
    }
    // A consistent LIST returns once the watch cache has every write: `rv` is then behind
    // the cache's 2 events, whatever its reflector's timing.
    assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
    let storage = virt_apiserver::storage::Storage::connect(std::slice::from_ref(&env.etcd_url))
        .await
        .unwrap();
    let now = storage.current_revision().await.unwrap();
    storage.compact(now).await.unwrap();
    let (code, s) = json_of(
        c.get(format!("{url}?limit=10&continue={token}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((code, s["reason"].as_str()), (410, Some("Expired")));
    assert!(
        s["metadata"]["continue"].is_string(),
        "a fresh token comes with the 410"
    );
    let text = c
        .get(format!("{url}?watch=1&resourceVersion={rv}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ev: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);

    // Resume from the current revision: only later changes, and bookmarks when asked.
    let mut stream = c
        .get(format!(
            "{url}?watch=1&resourceVersion={now}&allowWatchBookmarks=true&timeoutSeconds=4"
        ))
        .send()
        .await
        .unwrap()
        .bytes_stream();
    c.post(&url).json(&vm("late")).send().await.unwrap();
    let mut text = String::new();
    while let Some(Ok(chunk)) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let added: Vec<&Value> = events.iter().filter(|e| e["type"] == "ADDED").collect();
    assert_eq!(added.len(), 1);
    assert_eq!(added[0]["object"]["metadata"]["name"], "late");
    assert!(
        events.iter().any(|e| e["type"] == "BOOKMARK"),
        "periodic bookmark expected: {text}"
    );

    // A version this storage never reached (a client that watched a previous, reset
    // etcd) is 410 Gone after the grace — an ERROR event on the established stream, the
    // form clients re-list on — instead of waiting for a revision that may never come.
    let future = now + 1_000_000;
    let r = c
        .get(format!("{url}?watch=1&resourceVersion={future}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let ev: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(ev["type"], "ERROR", "{text}");
    let s = &ev["object"];
    assert_eq!(
        (&s["code"], s["reason"].as_str()),
        (&json!(410), Some("Expired")),
        "{s}"
    );
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains(&format!("too large resource version: {future}")),
        "{s}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vm_action_subresources_follow_kubevirt_semantics() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    let sub = format!(
        "{}/apis/subresources.kubevirt.io/v1/namespaces/default",
        env.server_url
    );
    c.post(&url).json(&vm("a")).send().await.unwrap();
    let put = |path: String, body: Value| c.put(path).json(&body).send();

    // dryRun validates and changes nothing.
    assert_eq!(
        put(
            format!("{sub}/virtualmachines/a/start"),
            json!({"dryRun": ["All"]})
        )
        .await
        .unwrap()
        .status(),
        202
    );
    let got: Value = c
        .get(format!("{url}/a"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["spec"]["runStrategy"], "Halted");

    // Halted → start flips runStrategy to Always; start again is a conflict.
    assert_eq!(
        put(format!("{sub}/virtualmachines/a/start"), json!({}))
            .await
            .unwrap()
            .status(),
        202
    );
    let got: Value = c
        .get(format!("{url}/a"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["spec"]["runStrategy"], "Always");
    let (code, s) = json_of(
        put(format!("{sub}/virtualmachines/a/start"), json!({}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((code, s["reason"].as_str()), (409, Some("Conflict")));
    // stop flips it back; restart of a Halted VM is refused.
    assert_eq!(
        put(format!("{sub}/virtualmachines/a/stop"), json!({}))
            .await
            .unwrap()
            .status(),
        202
    );
    let got: Value = c
        .get(format!("{url}/a"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["spec"]["runStrategy"], "Halted");
    let (code, s) = json_of(
        put(format!("{sub}/virtualmachines/a/restart"), json!({}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 409);
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("Halted does not support manual restart requests"),
        "{s}"
    );
    assert_eq!(
        put(format!("{sub}/virtualmachines/a/stop"), json!({}))
            .await
            .unwrap()
            .status(),
        409
    );

    // Manual: start is a state change request in status; spec is untouched.
    let mut manual = vm("m");
    manual["spec"]["runStrategy"] = json!("Manual");
    c.post(&url).json(&manual).send().await.unwrap();
    assert_eq!(
        put(
            format!("{sub}/virtualmachines/m/start"),
            json!({"paused": true})
        )
        .await
        .unwrap()
        .status(),
        202
    );
    let got: Value = c
        .get(format!("{url}/m"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        got["status"]["stateChangeRequests"],
        json!([{"action": "Start", "data": {"startPaused": "true"}}])
    );
    assert_eq!(
        got["metadata"]["generation"], 1,
        "status changes do not bump generation"
    );

    // Migrate needs a running instance; missing VM is 404 with the object named.
    assert_eq!(
        put(format!("{sub}/virtualmachines/m/migrate"), json!({}))
            .await
            .unwrap()
            .status(),
        409
    );
    let (code, s) = json_of(
        put(format!("{sub}/virtualmachines/nope/start"), json!({}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 404);
    assert_eq!(s["details"]["name"], "nope");
    assert_eq!(
        put(
            format!("{sub}/virtualmachines/a/start"),
            json!({"paused": "yes"})
        )
        .await
        .unwrap()
        .status(),
        400
    );

    // Console of a VMI that is not running yet: 400 (virtctl retries), missing: 404.
    let vmi = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "i"},
        "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}});
    let r = c
        .post(format!(
            "{}/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances",
            env.server_url
        ))
        .json(&vmi)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(
        c.get(format!("{sub}/virtualmachineinstances/i/console"))
            .send()
            .await
            .unwrap()
            .status(),
        400
    );
    assert_eq!(
        c.get(format!("{sub}/virtualmachineinstances/x/console"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        put(format!("{sub}/virtualmachineinstances/i/pause"), json!({}))
            .await
            .unwrap()
            .status(),
        400
    );

    let v: Value = c
        .get(format!(
            "{}/apis/subresources.kubevirt.io/v1/version",
            env.server_url
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v["gitVersion"].as_str().unwrap().starts_with('v'));

    // Metrics: requests by verb/resource/code, etcd latency and write counts.
    let m = metrics_text(&c, &env).await;
    assert!(m.contains("apiserver_request_total{verb=\"update\",resource=\"virtualmachines\",subresource=\"start\",code=\"202\"}"), "{m}");
    assert!(
        m.contains("etcd_request_duration_seconds_count{operation=\"update\"}"),
        "{m}"
    );
    let writes: f64 = m
        .lines()
        .find(|l| l.starts_with("apiserver_storage_writes_total"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    assert!(writes >= 5.0, "{writes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_side_apply_conflicts_and_force() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    let apply = |manager: &str, force: bool, strategy: &str| {
        let mut body = vm("ssa");
        body["spec"]["runStrategy"] = json!(strategy);
        c.patch(format!("{url}/ssa?fieldManager={manager}&force={force}"))
            .header("Content-Type", "application/apply-patch+yaml")
            .body(body.to_string())
            .send()
    };
    assert_eq!(
        apply("alice", false, "Halted").await.unwrap().status(),
        201,
        "apply creates"
    );
    assert_eq!(
        apply("alice", false, "Halted").await.unwrap().status(),
        200,
        "re-apply is fine"
    );
    let (code, s) = json_of(apply("bob", false, "Always").await.unwrap()).await;
    assert_eq!((code, s["reason"].as_str()), (409, Some("Conflict")));
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("conflict with \"alice\""),
        "{s}"
    );
    assert_eq!(s["details"]["causes"][0]["reason"], "FieldManagerConflict");
    assert_eq!(s["details"]["causes"][0]["field"], ".spec.runStrategy");
    let (code, obj) = json_of(apply("bob", true, "Always").await.unwrap()).await;
    assert_eq!(code, 200);
    assert_eq!(obj["spec"]["runStrategy"], "Always");
    let managers: Vec<&str> = obj["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert!(managers.contains(&"bob"), "{managers:?}");
    // An apply to /status names only the status (as a controller writes it), though a VM
    // requires a spec: the live spec stays, untouched and not owned by the status manager.
    let (code, obj) = json_of(
        c.patch(format!("{url}/ssa/status?fieldManager=carol"))
            .header("Content-Type", "application/apply-patch+yaml")
            .body(
                json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                       "metadata": {"name": "ssa"}, "status": {"printableStatus": "Stopped"}})
                .to_string(),
            )
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{obj}");
    assert_eq!(obj["status"]["printableStatus"], "Stopped");
    assert_eq!(obj["spec"]["runStrategy"], "Always");
    let carol = obj["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["manager"] == "carol")
        .unwrap();
    assert!(carol["fieldsV1"].get("f:spec").is_none(), "{carol}");
    // Impersonation asked of virt-apiserver directly is refused, not ignored.
    let (code, s) = json_of(
        c.get(&url)
            .header("Impersonate-User", "system:admin")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 403, "{s}");
    assert!(
        s["message"].as_str().unwrap().contains("impersonation"),
        "{s}"
    );
    // An apply creates only the object the URL names (the name the request was
    // authorized for), never another one from its body.
    let (code, s) = json_of(
        c.patch(format!("{url}/authorized?fieldManager=alice"))
            .header("Content-Type", "application/apply-patch+yaml")
            .body(vm("elsewhere").to_string())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 400, "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("does not match the name on the URL"),
        "{s}"
    );
    for n in ["authorized", "elsewhere"] {
        assert_eq!(
            c.get(format!("{url}/{n}")).send().await.unwrap().status(),
            404
        );
    }
    // Apply needs a field manager.
    let r = c
        .patch(format!("{url}/ssa"))
        .header("Content-Type", "application/apply-patch+yaml")
        .body(vm("ssa").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_fails_while_etcd_is_down() {
    let mut env = common::start(true);
    let anon = client(&env, None);
    assert_eq!(
        anon.get(format!("{}/readyz", env.server_url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    env.kill_etcd();
    // Ready through a gap of up to 15 s (etcd's membership changing under a drain), then
    // not: /healthz says at once.
    let killed = std::time::Instant::now();
    assert_eq!(
        anon.get(format!("{}/readyz", env.server_url))
            .send()
            .await
            .unwrap()
            .status(),
        200,
        "not ready at once after etcd's death"
    );
    assert_eq!(
        anon.get(format!("{}/healthz", env.server_url))
            .send()
            .await
            .unwrap()
            .status(),
        500
    );
    let r = loop {
        let r = anon
            .get(format!("{}/readyz?verbose", env.server_url))
            .send()
            .await
            .unwrap();
        if r.status() == 500 || killed.elapsed() > std::time::Duration::from_secs(30) {
            break r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert_eq!(r.status(), 500);
    assert!(killed.elapsed() >= std::time::Duration::from_secs(14));
    let text = r.text().await.unwrap();
    assert!(
        text.contains("[-]etcd failed") && text.ends_with("readyz check failed\n"),
        "{text}"
    );
    // Liveness does not depend on storage: restarting the pod would not help.
    assert_eq!(
        anon.get(format!("{}/livez", env.server_url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Writes fail cleanly with a Status instead of hanging.
    let (code, s) = json_of(
        admin(&env)
            .post(format!("{}{VMS}", env.server_url))
            .json(&vm("x"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(code >= 500, "{code} {s}");
    assert_eq!(s["kind"], "Status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_beyond_the_in_flight_budget_get_429_and_others_go_on() {
    let env = common::start_with(&["--max-mutating-requests-inflight=1"]);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);

    // A create whose body arrives slowly holds the one mutating slot.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let chunks = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    let body = reqwest::Body::wrap_stream(chunks);
    let slow = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move {
            c.post(&url)
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await
        }
    });
    let held = vm("slow").to_string().into_bytes();
    tx.send(Ok(held[..10].to_vec())).await.unwrap();
    // The channel holds one chunk: this second send returns once the client has taken the
    // first, i.e. the slow request is on the wire before any other write is sent (else that
    // write could take the slot first and the slow one be the refused one).
    tx.send(Ok(held[10..20].to_vec())).await.unwrap();

    // Another write is refused at once, in kube-apiserver's words, with Retry-After.
    let mut refused = None;
    for _ in 0..50 {
        let r = c.post(&url).json(&vm("other")).send().await.unwrap();
        if r.status() == 429 {
            refused = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = refused.expect("a second write while the first holds the slot gets 429");
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let (_, s) = json_of(r).await;
    assert_eq!(s["reason"], "TooManyRequests", "{s}");
    assert_eq!(s["details"]["retryAfterSeconds"], 1, "{s}");
    // Counted by the limit that refused it.
    let m = metrics_text(&c, &env).await;
    assert!(
        m.lines().any(|l| l
            .starts_with("apiserver_dropped_requests_total{request_kind=\"mutating\"}")
            && !l.ends_with(" 0")),
        "{m}"
    );
    // Reads have their own budget; watches are not counted.
    assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
    let w = c
        .get(format!("{url}?watch=true&timeoutSeconds=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(w.status(), 200);

    // The slow create completes; the slot is free again.
    tx.send(Ok(held[20..].to_vec())).await.unwrap();
    drop(tx);
    let r = slow.await.unwrap().unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(
        c.post(&url)
            .json(&vm("other"))
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_connections_are_closed_and_cannot_crowd_out_clients() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Headers are given a minute: only shedding at the limit can let a client in sooner.
    let env = common::start_with(&["--max-connections=3", "--header-read-timeout-seconds=60"]);
    let port: u16 = env.server_url.rsplit(':').next().unwrap().parse().unwrap();
    // Three clients that shake hands and then send half a request line: every slot.
    let mut silent = Vec::new();
    for _ in 0..3 {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let mut tls = common::tls_client(&env)
            .connect(
                rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                tcp,
            )
            .await
            .unwrap();
        tls.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        silent.push(tls);
    }
    // A real client gets its answer long before the silent ones' headers are due: its
    // connection, accepted at the limit, closes the oldest one that sent no request.
    let r = admin(&env)
        .get(format!("{}{VMS}", env.server_url))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("a client behind three silent connections");
    assert_eq!(r.status(), 200);
    let mut closed = 0;
    for mut tls in silent {
        let mut buf = [0u8; 512];
        match tokio::time::timeout(Duration::from_secs(2), tls.read(&mut buf)).await {
            // Closed without a response to the half request.
            Ok(Ok(0)) | Ok(Err(_)) => closed += 1,
            Ok(Ok(n)) => panic!("{}", String::from_utf8_lossy(&buf[..n])),
            Err(_) => {}
        }
    }
    assert!(closed >= 1, "no silent connection was closed to make room");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_gets_429_beyond_its_watch_limit_until_one_ends() {
    let env = common::start_with(&["--max-watches-per-user=2"]);
    let c = admin(&env);
    let watch = format!("{}{VMS}?watch=true", env.server_url);
    let first = c.get(&watch).send().await.unwrap();
    let second = c.get(&watch).send().await.unwrap();
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let r = c.get(&watch).send().await.unwrap();
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let (code, s) = json_of(r).await;
    assert_eq!((code, s["reason"].as_str()), (429, Some("TooManyRequests")));
    assert!(
        s["message"]
            .as_str()
            .unwrap_or("")
            .contains("Too many watches"),
        "{s}"
    );
    let m = metrics_text(&c, &env).await;
    assert!(
        m.contains("apiserver_dropped_requests_total{request_kind=\"watch\"} 1"),
        "{m}"
    );
    // Other requests of the same user are not affected.
    assert_eq!(
        c.get(format!("{}{VMS}", env.server_url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // A watch that ends frees its slot.
    drop(first);
    let mut again = None;
    for _ in 0..50 {
        let r = c.get(&watch).send().await.unwrap();
        if r.status() == 200 {
            again = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(again.is_some(), "no watch after one of two ended");
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deeply_nested_documents_are_refused_and_the_server_goes_on() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    for (ct, body) in [
        ("application/json", "[".repeat(200_000)),
        ("application/yaml", "[".repeat(200_000)),
        ("application/yaml", "- ".repeat(50_000)),
        (
            "application/json",
            format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000)),
        ),
    ] {
        let r = c
            .post(&url)
            .header("Content-Type", ct)
            .body(body)
            .send()
            .await
            .expect("an answer, not a dead server");
        assert_eq!(r.status(), 400, "{ct}");
    }
    assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
}

/// `evacuate/cancel` removes a VMI's evacuation mark (and nothing else), answers 409 for a
/// VMI that is not being evacuated, honours dryRun, and is reached on the VM too.
#[tokio::test]
async fn evacuate_cancel_removes_the_evacuation_mark() {
    let env = common::start(true);
    let c = admin(&env);
    let vmis = format!(
        "{}/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances",
        env.server_url
    );
    let sub = format!(
        "{}/apis/subresources.kubevirt.io/v1/namespaces/default",
        env.server_url
    );
    let mut vmi = vm("e")["spec"]["template"].clone();
    vmi["apiVersion"] = json!("kubevirt.io/v1");
    vmi["kind"] = json!("VirtualMachineInstance");
    vmi["metadata"] = json!({"name": "e"});
    assert_eq!(c.post(&vmis).json(&vmi).send().await.unwrap().status(), 201);
    c.post(format!("{}{VMS}", env.server_url))
        .json(&vm("e"))
        .send()
        .await
        .unwrap();
    let cancel = |path: String, body: Value| c.put(path).json(&body).send();

    let (code, s) = json_of(
        cancel(
            format!("{sub}/virtualmachineinstances/e/evacuate/cancel"),
            json!({}),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(code, 409, "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("not being evacuated"),
        "{s}"
    );
    // The subresource is `evacuate/cancel`, not `evacuate`.
    assert_eq!(
        cancel(
            format!("{sub}/virtualmachineinstances/e/evacuate"),
            json!({})
        )
        .await
        .unwrap()
        .status(),
        404
    );

    let mark = || async {
        let mut cur: Value = c
            .get(format!("{vmis}/e"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        cur["status"] = json!({"evacuationNodeName": "n1", "nodeName": "n1"});
        let r = c
            .put(format!("{vmis}/e/status"))
            .json(&cur)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    };
    let marked = || async {
        let cur: Value = c
            .get(format!("{vmis}/e"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        cur["status"]["evacuationNodeName"]
            .as_str()
            .map(str::to_string)
    };
    let vmi_cancel = format!("{sub}/virtualmachineinstances/e/evacuate/cancel");
    let code = |body: Value, path: String| {
        let r = cancel(path, body);
        async move { r.await.unwrap().status().as_u16() }
    };
    mark().await;
    assert_eq!(
        code(json!({"dryRun": ["All"]}), vmi_cancel.clone()).await,
        200
    );
    assert_eq!(
        marked().await.as_deref(),
        Some("n1"),
        "a dry run changes nothing"
    );
    assert_eq!(code(json!({}), vmi_cancel.clone()).await, 200);
    assert_eq!(marked().await, None);

    mark().await;
    let vm_cancel = format!("{sub}/virtualmachines/e/evacuate/cancel");
    assert_eq!(code(json!({}), vm_cancel).await, 200);
    assert_eq!(marked().await, None);
    let cur: Value = c
        .get(format!("{vmis}/e"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(cur["status"]["nodeName"], "n1", "only the mark goes");
}
