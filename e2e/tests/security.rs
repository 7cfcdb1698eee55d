//! Node security (issue 15) as a namespace user sees it: the launcher pod runs without
//! privilege (every process in it uid 107 with no effective capability, its spec asks for
//! nothing more, no host path) in a namespace enforcing Pod Security `restricted`, while
//! its VM boots, its console works and it live-migrates; an image whose disk is a
//! symbolic link fails the VMI with a message naming the file, before any launcher opens it.
//!
//! Run with `cargo test -p e2e --test security -- --ignored --test-threads=1`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Console, Ns};

/// The `Uid:` and `CapEff:` lines of every process in the launcher's compute container.
fn processes_of(ns: &Ns<'_>, pod: &str) -> Vec<(String, String)> {
    let out = ns
        .k(&[
            "exec",
            pod,
            "-c",
            "compute",
            "--",
            "sh",
            "-c",
            "for s in /proc/[0-9]*/status; do cat $s; echo; done",
        ])
        .expect("kubectl exec into the launcher");
    out.split("\n\n")
        .filter_map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            };
            Some((
                format!("{} {}", field("Name:")?, field("Uid:")?),
                field("CapEff:")?,
            ))
        })
        .collect()
}

#[test]
#[ignore = "needs a local cluster: cargo xtask cluster up"]
fn launcher_pod_runs_without_privilege_under_restricted_pod_security() {
    let c = common::two_node_cluster();
    let ns = Ns::new(c, "unpriv");
    // kube-apiserver's PodSecurity admission refuses any pod of this namespace that is
    // not `restricted`: a launcher pod with a hostPath, a capability or root would never
    // be created, and the VM never run.
    ns.k(&[
        "label",
        "namespace",
        &ns.name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    ])
    .expect("labelling the namespace restricted");
    ns.apply_vm("calm", "Always");
    ns.wait_running("calm");
    let console = Console::open(&ns, "calm");
    common::wait_for_shell(&console, &ns, "calm");
    common::compute(&console, &ns, "calm", 6, 7);

    let pods = ns.launcher_pods("calm");
    assert_eq!(pods.len(), 1, "{pods:?}");
    let pod = pods[0].trim_start_matches("pod/");
    let procs = processes_of(&ns, pod);
    // The launcher, the reaper, libvirtd, QEMU and the exec'd shell itself.
    assert!(
        procs.iter().any(|(p, _)| p.starts_with("qemu-system")),
        "no QEMU among {procs:?}"
    );
    for (p, caps) in &procs {
        assert!(
            p.ends_with(" 107 107 107 107"),
            "{p}: not uid 107 in every field"
        );
        assert_eq!(caps, "0000000000000000", "{p}: effective capabilities");
    }

    let sc = ns.get(
        "pod",
        pod,
        "{.spec.securityContext.runAsNonRoot} {.spec.containers[0].securityContext.privileged} \
         {.spec.containers[0].securityContext.allowPrivilegeEscalation} \
         {.spec.containers[0].securityContext.capabilities.drop[0]} \
         {.spec.containers[0].securityContext.readOnlyRootFilesystem} \
         {.spec.securityContext.seccompProfile.type}",
    );
    assert_eq!(
        sc.split_whitespace().collect::<Vec<_>>(),
        ["true", "false", "ALL", "true", "RuntimeDefault"],
        "launcher pod security context: {sc}"
    );
    let host_paths = ns.get("pod", pod, "{.spec.volumes[*].hostPath.path}");
    assert_eq!(host_paths.trim(), "", "host paths in the launcher pod");

    // A live migration: the target pod is admitted too, and the console reaches the guest
    // on its new node through the new pod's sockets.
    let before = ns.get("vmi", "calm", "{.status.nodeName}");
    ns.virt(&["migrate", "calm"]);
    let t0 = std::time::Instant::now();
    ns.wait(
        "calm",
        "the migration to complete",
        Duration::from_secs(240),
        || {
            ns.try_get("vmi", "calm", "{.status.migrationState.completed}")
                .is_ok_and(|v| v.trim() == "true")
                && ns
                    .try_get("vmi", "calm", "{.status.nodeName}")
                    .is_ok_and(|n| n.trim() != before.trim())
        },
    );
    eprintln!("migrated from {before} in {:?}", t0.elapsed());
    drop(console);
    let console = Console::open(&ns, "calm");
    common::wait_for_shell(&console, &ns, "calm");
    common::compute(&console, &ns, "calm", 5, 8);
}

#[test]
#[ignore = "needs a local cluster: cargo xtask cluster up"]
fn a_symlink_in_a_disk_image_fails_the_vmi_naming_it() {
    const IMAGE: &str = "localhost/e2e/symlinked-disk:v1";
    let c = common::cluster();
    let dir = std::env::temp_dir().join(format!("e2e-symlink-{}", std::process::id()));
    let disk = dir.join("disk");
    std::fs::create_dir_all(&disk).expect("temp dir");
    // KubeVirt's containerDisk layout (/disk/<file>), the file a link to a host secret.
    let _ = std::fs::remove_file(disk.join("disk.img"));
    std::os::unix::fs::symlink("/etc/shadow", disk.join("disk.img")).expect("symlink");
    let archive = e2e::scratch_image(IMAGE, &[(disk.as_path(), "/disk")], &["/nothing"], &dir)
        .expect("image");
    c.load_image(&archive).expect("load image");
    let _ = std::fs::remove_dir_all(&dir);

    let ns = Ns::new(c, "symlink");
    let vmi = common::guest_vmi(
        &ns.name,
        "linked",
        serde_json::json!([{"name": "data", "disk": {"bus": "virtio"}}]),
        serde_json::json!([{"name": "data", "containerDisk": {"image": IMAGE, "imagePullPolicy": "Never"}}]),
    );
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&vmi))
        .expect("create VMI");
    ns.wait(
        "linked",
        "the VMI to fail",
        Duration::from_secs(120),
        || {
            ns.try_get("vmi", "linked", "{.status.phase}")
                .is_ok_and(|p| p == "Failed")
        },
    );
    let message = ns.get(
        "vmi",
        "linked",
        "{.status.conditions[?(@.type==\"Ready\")].message}",
    );
    assert!(
        message.contains("/disk/disk.img in the image is not a regular file"),
        "the failure names the file: {message}"
    );
}

/// Cloud-init user data — inline, and from a Secret the VMI names — reaches the guest,
/// but never the launcher pod, whose annotations the `view` role reads.
#[test]
#[ignore = "needs a local cluster: cargo xtask cluster up"]
fn cloud_init_secrets_reach_the_guest_but_not_the_pod() {
    let c = common::cluster();
    let ns = Ns::new(c, "cloudinit");
    let inline = "#cloud-config\n# marker inline-c0ffee\n";
    let from_secret = "#cloud-config\n# marker secret-beef42\n";
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "user-data", "namespace": ns.name},
        "stringData": {"userdata": from_secret}
    });
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&secret.to_string()))
        .expect("secret");
    let vmi = common::guest_vmi(
        &ns.name,
        "seeded",
        serde_json::json!([
            {"name": "ci", "disk": {"bus": "virtio"}},
            {"name": "ci2", "disk": {"bus": "virtio"}}
        ]),
        serde_json::json!([
            {"name": "ci", "cloudInitNoCloud": {"userData": inline}},
            {"name": "ci2", "cloudInitNoCloud": {"secretRef": {"name": "user-data"}}}
        ]),
    );
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&vmi))
        .expect("create VMI");
    ns.wait("seeded", "the VMI to run", common::BOOT, || {
        ns.try_get("vmi", "seeded", "{.status.phase}")
            .is_ok_and(|p| p == "Running")
    });
    let console = Console::open(&ns, "seeded");
    common::wait_for_shell(&console, &ns, "seeded");
    console.line(
        "for d in /dev/vd?; do mount -t iso9660 -o ro $d /mnt 2>/dev/null && cat /mnt/user-data && umount /mnt; done",
    );
    console.expect(
        &ns,
        "seeded",
        "marker inline-c0ffee",
        Duration::from_secs(60),
    );
    console.expect(
        &ns,
        "seeded",
        "marker secret-beef42",
        Duration::from_secs(60),
    );

    let pods = ns.k(&["get", "pods", "-o", "json"]).expect("pods");
    assert!(
        !pods.contains("inline-c0ffee") && !pods.contains("secret-beef42"),
        "user data in the launcher pod:\n{pods}"
    );
}

/// A namespace user with `kubevirt.io:edit` (through kube-apiserver and impersonation, as
/// a real user arrives) cannot ask the node for more than a VM: a volume name that would
/// leave the launcher's directory, a reserved `kubevirt.io/` label, and edits of a VMI's
/// volumes are 422s naming the field, and nothing is stored.
#[test]
#[ignore = "needs a local cluster: cargo xtask cluster up"]
fn a_namespace_editor_cannot_reach_the_node_through_a_spec() {
    let c = common::cluster();
    let ns = Ns::new(c, "editor");
    let user = "e2e-editor@example.com";
    ns.k(&[
        "create",
        "rolebinding",
        "e2e-edit",
        "--clusterrole=kubevirt.io:edit",
        &format!("--user={user}"),
    ])
    .expect("rolebinding");
    let apply_as = |doc: &str| {
        c.kubectl_stdin_result(&["apply", "--as", user, "-n", &ns.name, "-f", "-"], doc)
            .expect("kubectl")
    };
    let escaping = common::guest_vmi(
        &ns.name,
        "escape",
        serde_json::json!([{"name": "../x", "disk": {"bus": "virtio"}}]),
        serde_json::json!([{"name": "../x", "emptyDisk": {"capacity": "1Mi"}}]),
    );
    let (ok, _, err) = apply_as(&escaping);
    assert!(
        !ok && err.contains("Invalid") && err.contains("../x"),
        "{err}"
    );

    let mut pinned: serde_json::Value = serde_json::from_str(&common::vm_manifest(
        "pinned",
        &ns.name,
        "Halted",
        &common::Guest::default(),
    ))
    .unwrap();
    pinned["metadata"]["labels"]["kubevirt.io/nodeName"] = serde_json::json!("some-node");
    let (ok, _, err) = apply_as(&pinned.to_string());
    assert!(
        !ok && err.contains("kubevirt.io/nodeName"),
        "a reserved label: {err}"
    );

    // A VMI's volumes cannot change after creation (a disk added to a running VM would
    // then travel with it on the next migration).
    let plain = common::guest_vmi(
        &ns.name,
        "plain",
        serde_json::json!([]),
        serde_json::json!([]),
    );
    let (ok, _, err) = apply_as(&plain);
    assert!(ok, "creating a plain VMI as the editor: {err}");
    let (ok, _, err) = c
        .kubectl_result(&[
            "patch",
            "vmi",
            "plain",
            "--as",
            user,
            "-n",
            &ns.name,
            "--type=merge",
            "-p",
            r#"{"spec":{"volumes":[{"name":"more","emptyDisk":{"capacity":"1Mi"}}]}}"#,
        ])
        .expect("kubectl");
    assert!(
        !ok && err.contains("spec.volumes") && err.contains("immutable"),
        "editing a VMI's volumes: {err}"
    );
    for (kind, name) in [("vmi", "escape"), ("vm", "pinned")] {
        assert!(
            ns.try_get(kind, name, "{.metadata.name}")
                .is_ok_and(|n| n.is_empty()),
            "{kind}/{name} was stored"
        );
    }
}

/// kubectl as the holder of `token` only (no client certificate: kube-apiserver would
/// authenticate that first).
fn kubectl_as(
    c: &e2e::Cluster,
    dir: &std::path::Path,
    token: &str,
    args: &[&str],
    stdin: &str,
) -> (bool, String) {
    use std::io::Write;
    let view = |path: &str| {
        c.kubectl(&[
            "config",
            "view",
            "--raw",
            "--minify",
            "--flatten",
            "-o",
            &format!("jsonpath={{.clusters[0].cluster.{path}}}"),
        ])
        .expect("kubeconfig")
    };
    let kc = dir.join("token.kubeconfig");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: t\n\
             clusters: [{{name: t, cluster: {{server: '{}', certificate-authority-data: '{}'}}}}]\n\
             users: [{{name: t, user: {{token: '{token}'}}}}]\n\
             contexts: [{{name: t, context: {{cluster: t, user: t}}}}]\n",
            view("server"),
            view("certificate-authority-data")
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(c.kubectl_path())
        .arg("--kubeconfig")
        .arg(&kc)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// One request over mTLS to `addr` as `cert`/`key`, the server verified as `server_name`
/// against `ca`: the status code and body, or why the connection failed.
fn https_get(
    addr: &str,
    ca: &str,
    (cert, key): (&str, &str),
    server_name: &str,
    path: &str,
) -> anyhow::Result<(u16, String)> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::io::{Read, Write};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c?)?;
    }
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, PrivateKeyDer::from_pem_slice(key.as_bytes())?)?;
    let mut conn = rustls::ClientConnection::new(
        std::sync::Arc::new(cfg),
        ServerName::try_from(server_name.to_string())?,
    )?;
    let mut tcp = std::net::TcpStream::connect_timeout(&addr.parse()?, Duration::from_secs(5))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: virt-handler\r\nconnection: close\r\n\r\n")
            .as_bytes(),
    )?;
    let mut text = String::new();
    let _ = tls.read_to_string(&mut text);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no HTTP answer: {text:?}"))?;
    Ok((code, text))
}

/// Each virt-handler holds a certificate for its own node only: a token bound to the handler
/// pod of node A gets a certificate for A and is denied one for B; with A's certificate the
/// handler of node B answers nothing (only virt-apiserver's certificate is served there), and
/// B's handler is not taken for A's.
#[test]
#[ignore = "needs a local cluster: cargo xtask cluster up"]
fn a_handler_certificate_speaks_for_its_own_node_only() {
    let c = common::two_node_cluster();
    let pods: Vec<Vec<String>> = c
        .component_pods(
            "virt-handler",
            true,
            "{range .items[*]}{.metadata.name} {.metadata.uid} {.spec.nodeName} {.status.podIP}{\"\\n\"}{end}",
        )
        .expect("handler pods")
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .filter(|f: &Vec<String>| f.len() == 4)
        .collect();
    assert!(pods.len() >= 2, "two running handlers: {pods:?}");
    let (a, b) = (&pods[0], &pods[1]);
    let (node_a, node_b) = (a[2].as_str(), b[2].as_str());
    // What kubelet mounts into the handler pod of node A.
    let token = c
        .kubectl(&[
            "-n",
            "kubevirt",
            "create",
            "token",
            "virt-handler",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            &a[0],
            "--bound-object-uid",
            &a[1],
            "--duration",
            "10m",
        ])
        .expect("a token bound to the handler pod")
        .trim()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let suffix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let ask = |name: &str, node: &str| {
        let req = virt_certs::node_identity::request(node).unwrap();
        use base64::Engine;
        let csr = serde_json::json!({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {"signerName": virt_certs::node_identity::SIGNER_NAME,
                "usages": virt_certs::node_identity::USAGES,
                "request": base64::engine::general_purpose::STANDARD.encode(&req.csr_pem)}});
        let (ok, out) = kubectl_as(
            c,
            dir.path(),
            &token,
            &["create", "-f", "-"],
            &csr.to_string(),
        );
        assert!(ok, "creating {name} as the handler of {node_a}: {out}");
        req
    };
    let wait = |name: &str| -> (String, String) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let out = c
                .kubectl(&[
                    "get",
                    "csr",
                    name,
                    "-o",
                    "jsonpath={.status.conditions[*].type}|{.status.conditions[*].message}|{.status.certificate}",
                ])
                .unwrap_or_default();
            let parts: Vec<&str> = out.splitn(3, '|').collect();
            if parts.len() == 3 && (parts[0].contains("Denied") || !parts[2].is_empty()) {
                return (parts[0].to_string(), format!("{}|{}", parts[1], parts[2]));
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name} not decided: {out}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };

    let other = format!("e2e-other-node-{suffix}");
    ask(&other, node_b);
    let (conds, rest) = wait(&other);
    assert!(conds.contains("Denied"), "{conds} {rest}");
    assert!(rest.contains(node_b) && rest.contains(node_a), "{rest}");

    let own = format!("e2e-own-node-{suffix}");
    let req = ask(&own, node_a);
    let (conds, rest) = wait(&own);
    assert!(conds.contains("Approved"), "{conds} {rest}");
    use base64::Engine;
    let cert = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(rest.split('|').nth(1).unwrap().trim())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        virt_certs::node_identity::common_name_of_pem(&cert).as_deref(),
        Some(format!("virt-handler:{node_a}").as_str())
    );

    // A genuine certificate of node A's handler, used against node B's handler.
    let ca = c.handler_ca_bundle().expect("handler CA bundle");
    let addr_b = format!("{}:8186", b[3]);
    let path = "/v1/namespaces/default/virtualmachineinstances/any/console";
    let (code, text) = https_get(&addr_b, &ca, (&cert, &req.key_pem), node_b, path)
        .expect("TLS to the handler of node B");
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("virt-apiserver"), "{text}");
    // Node B's handler does not pass for node A's.
    let err = https_get(&addr_b, &ca, (&cert, &req.key_pem), node_a, path).unwrap_err();
    assert!(format!("{err:#}").contains("certificate"), "{err:#}");
    for name in [&own, &other] {
        let _ = c.kubectl(&["delete", "csr", name.as_str(), "--wait=false"]);
    }
    println!(
        "handler identity: {node_a}'s token got a certificate for {node_a} only; node {node_b}'s handler answered it 403"
    );
}
