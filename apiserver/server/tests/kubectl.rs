//! The real kubectl (`$KUBECTL` or the local cluster's, see `common::kubectl_binary`)
//! against a real virt-apiserver and etcd.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Kubectl;

const VM_YAML: &str = r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: testvm
  labels: {app: demo}
spec:
  runStrategy: Halted
  template:
    metadata:
      labels: {kubevirt.io/vm: testvm}
    spec:
      domain:
        devices:
          disks:
          - name: containerdisk
            disk: {bus: virtio}
        resources:
          requests: {memory: 64Mi}
      volumes:
      - name: containerdisk
        containerDisk: {image: localhost/kubevirt-rs/test-guest:latest}
"#;

#[test]
fn kubectl_workflow() {
    let env = common::start(true);
    let k = Kubectl {
        kubeconfig: &env.kubeconfig,
    };

    let res = k.ok(&["api-resources", "--api-group=kubevirt.io"]);
    for (name, short) in [
        ("virtualmachines", "vm,vms"),
        ("virtualmachineinstances", "vmi,vmis"),
        ("virtualmachineinstancemigrations", "vmim,vmims"),
    ] {
        assert!(
            res.lines()
                .any(|l| l.starts_with(name) && l.contains(short)),
            "{name} missing: {res}"
        );
    }

    let explain = k.ok(&["explain", "vm.spec.runStrategy"]);
    assert!(explain.contains("RerunOnFailure"), "{explain}");

    let created = k.run_stdin(&["create", "-f", "-"], Some(VM_YAML));
    assert!(
        created.ok && created.stdout.contains("testvm created"),
        "{}",
        created.stderr
    );
    let applied = k.run_stdin(&["apply", "-f", "-"], Some(VM_YAML));
    assert!(applied.ok, "{}", applied.stderr);
    let again = k.run_stdin(&["apply", "-f", "-"], Some(VM_YAML));
    assert!(
        again.stdout.contains("unchanged"),
        "second apply: {} {}",
        again.stdout,
        again.stderr
    );
    let ssa = k.run_stdin(
        &["apply", "--server-side", "-f", "-"],
        Some(&VM_YAML.replace("testvm", "ssavm")),
    );
    assert!(
        ssa.ok && ssa.stdout.contains("serverside-applied"),
        "{}",
        ssa.stderr
    );

    let table = k.ok(&["get", "vm"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "AGE", "STATUS", "READY"]);
    let wide = k.ok(&["get", "vm", "-o", "wide"]);
    assert!(wide.lines().next().unwrap().contains("NODE"), "{wide}");
    let yaml = k.ok(&["get", "vm", "testvm", "-o", "yaml"]);
    assert!(
        yaml.contains("runStrategy: Halted") && yaml.contains("uid:"),
        "{yaml}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&k.ok(&["get", "vm", "testvm", "-o", "json"])).unwrap();
    assert_eq!(json["metadata"]["generation"], 1);
    let all = k.ok(&["get", "all"]);
    assert!(all.contains("virtualmachine.kubevirt.io/testvm"), "{all}");

    // A watch sees the label change as a MODIFIED event.
    let mut watch = Command::new(common::kubectl_binary())
        .env("KUBECONFIG", &env.kubeconfig)
        .args(["get", "vm", "testvm", "-w", "--output-watch-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Table watch output: a header with EVENT, then the initial ADDED row.
    let header = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        header.starts_with("EVENT") && header.contains("STATUS"),
        "{header}"
    );
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        first.starts_with("ADDED") && first.contains("testvm"),
        "{first}"
    );
    k.ok(&["label", "vm", "testvm", "tier=gold"]);
    let ev = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(ev.starts_with("MODIFIED"), "{ev}");
    let _ = watch.kill();
    let _ = watch.wait();

    k.ok(&["annotate", "vm", "testvm", "owner=team-a"]);
    k.ok(&[
        "patch",
        "vm",
        "testvm",
        "--type=merge",
        "-p",
        r#"{"spec":{"runStrategy":"Manual"}}"#,
    ]);
    k.ok(&[
        "patch",
        "vm",
        "testvm",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/runStrategy","value":"Always"}]"#,
    ]);
    let smp = k.run(&[
        "patch",
        "vm",
        "testvm",
        "-p",
        r#"{"spec":{"runStrategy":"Manual"}}"#,
    ]);
    assert!(
        !smp.ok
            && smp
                .stderr
                .contains("application/strategic-merge-patch+json is not supported"),
        "{}",
        smp.stderr
    );
    let got: serde_json::Value =
        serde_json::from_str(&k.ok(&["get", "vm", "testvm", "-o", "json"])).unwrap();
    assert_eq!(got["spec"]["runStrategy"], "Always");
    assert_eq!(got["metadata"]["labels"]["tier"], "gold");
    assert_eq!(got["metadata"]["annotations"]["owner"], "team-a");
    assert_eq!(
        got["metadata"]["generation"], 3,
        "two spec changes bump generation twice"
    );

    // replace with a stale resourceVersion is a Conflict.
    let mut stale = json.clone();
    stale["metadata"]["resourceVersion"] = json["metadata"]["resourceVersion"].clone();
    let r = k.run_stdin(&["replace", "-f", "-"], Some(&stale.to_string()));
    assert!(
        !r.ok && r.stderr.contains("Conflict") && r.stderr.contains("the object has been modified"),
        "{}",
        r.stderr
    );

    // Unknown fields: kubectl asks for strict validation.
    let bad = k.run_stdin(
        &["create", "-f", "-"],
        Some(
            &VM_YAML
                .replace("testvm", "bad")
                .replace("runStrategy: Halted", "runStrategy: Halted\n  bogus: 1"),
        ),
    );
    assert!(
        !bad.ok && bad.stderr.contains("unknown field \"spec.bogus\""),
        "{}",
        bad.stderr
    );

    k.ok(&["delete", "vm", "testvm"]);
    assert!(!k.run(&["get", "vm", "testvm"]).ok);
    k.ok(&["delete", "vm", "--all"]);
    let none = k.run(&["get", "vm"]);
    assert!(
        none.stderr.contains("No resources found"),
        "{} {}",
        none.stdout,
        none.stderr
    );

    // The `example` of every create in the published OpenAPI is an object kubectl sends
    // as is (strict field validation) and the server creates, twice (generateName).
    let doc: serde_json::Value =
        serde_json::from_str(&k.ok(&["get", "--raw", "/openapi/v3/apis/kubevirt.io/v1"])).unwrap();
    for (plural, kind) in [
        ("virtualmachines", "virtualmachine"),
        ("virtualmachineinstances", "virtualmachineinstance"),
        (
            "virtualmachineinstancemigrations",
            "virtualmachineinstancemigration",
        ),
    ] {
        let example = &doc["paths"]
            [&format!("/apis/kubevirt.io/v1/namespaces/{{namespace}}/{plural}")]["post"]["requestBody"]
            ["content"]["application/json"]["example"];
        assert!(example.is_object(), "{plural}: no example");
        for _ in 0..2 {
            let out = k.run_stdin(&["create", "-f", "-"], Some(&example.to_string()));
            assert!(
                out.ok && out.stdout.contains(&format!("{kind}.kubevirt.io/example-")),
                "{plural}: {} {}",
                out.stdout,
                out.stderr
            );
        }
        let names = k.ok(&["get", plural, "-o", "name"]);
        assert_eq!(names.lines().count(), 2, "{names}");
        k.ok(&["delete", plural, "--all"]);
    }
}
