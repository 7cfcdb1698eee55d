//! `kubectl virt` against the real cluster: heavy console output arrives byte-exact, the VNC
//! proxy speaks RFB, and the errors a person meets (wrong namespace, missing VM, VM not
//! running, no permission) say what to fix and exit 1. The lifecycle commands are in
//! vm_lifecycle.rs; `start --paused` is here; `adm backup`/`adm restore` in restore.rs (a
//! cluster-wide restore, run alone).
//!
//! Needs root and the packages of docs/local-cluster.md and docs/deploy.md. Run with
//! `cargo test -p e2e --test plugin -- --ignored --test-threads=1`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// Bytes of random data the guest encodes: base64 makes it 10 MiB of text (plus newlines).
const RANDOM_BYTES: usize = 7_864_320;
/// Under TCG every byte is an emulated UART write; this is generous.
const TRANSFER: Duration = Duration::from_secs(900);

/// `kubectl virt console` with pipes: stdout collected on a thread, stdin kept open.
struct PipedConsole {
    child: Child,
    stdin: ChildStdin,
    out: Arc<Mutex<Vec<u8>>>,
}

impl PipedConsole {
    fn open(ns: &Ns<'_>, vmi: &str) -> PipedConsole {
        let mut child = Command::new(ns.c.kubectl_path())
            .env("PATH", plugin_path())
            .env("KUBECONFIG", &ns.c.kubeconfig)
            .args(["virt", "console", vmi, "-n", &ns.name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl virt console");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(Vec::with_capacity(12 << 20)));
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        PipedConsole { child, stdin, out }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stdin.write_all(bytes).expect("console stdin");
        self.stdin.flush().expect("console stdin");
    }

    fn contains(&self, needle: &[u8]) -> bool {
        find(&self.out.lock().unwrap(), needle, 0).is_some()
    }

    fn output(&self) -> Vec<u8> {
        self.out.lock().unwrap().clone()
    }

    /// The last bytes of output, for failure messages.
    fn tail(&self) -> String {
        let out = self.out.lock().unwrap();
        let from = out.len().saturating_sub(600);
        String::from_utf8_lossy(&out[from..]).into_owned()
    }
}

impl Drop for PipedConsole {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

fn sha256_hex(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum (coreutils)");
    let mut stdin = child.stdin.take().unwrap();
    let owned = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&owned));
    let out = child.wait_with_output().expect("sha256sum");
    writer.join().unwrap().expect("feeding sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn ten_megabytes_of_console_output_arrive_byte_exact() {
    let c = cluster();
    let ns = Ns::new(c, "bulk");
    ns.apply_vm("bulk", "Always");
    ns.wait_running("bulk");
    let mut con = PipedConsole::open(&ns, "bulk");
    let prompt = virt_testguest::PROMPT.trim().as_bytes();
    ns.wait(
        "bulk",
        "the guest's prompt on the piped console",
        BOOT,
        || {
            con.send(b"\r");
            std::thread::sleep(Duration::from_secs(1));
            con.contains(prompt)
        },
    );
    // Raw mode on the guest's side: no \n → \r\n, so the bytes are the file's bytes. The
    // markers are split in the typed line (BEGIN""-DATA) so the echo never matches them.
    let cmd = format!(
        "head -c {RANDOM_BYTES} /dev/urandom | base64 > /tmp/d; S=$(sha256sum < /tmp/d); \
         stty raw -echo; echo BEGIN\"\"-DATA; cat /tmp/d; echo END\"\"-DATA $S; stty sane\r"
    );
    let started = Instant::now();
    con.send(cmd.as_bytes());
    let end_marker = b"\nEND-DATA ";
    let done = |out: &[u8]| {
        find(out, end_marker, 0).is_some_and(|i| {
            out.get(i + end_marker.len()..)
                .is_some_and(|rest| rest.len() >= 64 && rest.contains(&b'\n'))
        })
    };
    if let Err(e) = c.eventually("the guest's data and checksum", TRANSFER, || {
        Ok(done(&con.output()))
    }) {
        panic!("{e:#}\nlast output: {}", con.tail());
    }
    let elapsed = started.elapsed();
    let out = con.output();
    let begin = find(&out, b"BEGIN-DATA\n", 0).expect("begin marker") + b"BEGIN-DATA\n".len();
    let end = find(&out, end_marker, begin).expect("end marker");
    // The data's last newline is the file's; the marker's newline comes from echo.
    let data = &out[begin..=end];
    let rest = &out[end + end_marker.len()..];
    let guest_sum = String::from_utf8_lossy(&rest[..64]).into_owned();
    assert!(data.len() >= 10 << 20, "only {} bytes arrived", data.len());
    assert_eq!(
        sha256_hex(data),
        guest_sum,
        "{} bytes arrived, not the guest's",
        data.len()
    );
    println!(
        "{} bytes byte-exact through kubectl virt console in {:.1} s ({:.2} MB/s, incl. the \
         guest generating them)",
        data.len(),
        elapsed.as_secs_f64(),
        data.len() as f64 / 1e6 / elapsed.as_secs_f64()
    );
    // The console still works afterwards, and Ctrl+] leaves with exit code 0.
    con.send(b"echo $((6*7))\r");
    ns.wait(
        "bulk",
        "the guest's answer after the bulk output",
        BOOT,
        || find(&con.output(), b"\n42", end).is_some(),
    );
    con.send(&[0x1d]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = con.child.try_wait().expect("console status") {
            break s;
        }
        assert!(Instant::now() < deadline, "console did not exit on Ctrl+]");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "console exited with {status}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn vnc_proxy_only_answers_an_rfb_handshake() {
    let c = cluster();
    let ns = Ns::new(c, "vnc");
    ns.apply_vm("vnc", "Always");
    ns.wait_running("vnc");
    let port = free_port();
    let mut proxy = Command::new(c.kubectl_path())
        .env("PATH", plugin_path())
        .env("KUBECONFIG", &c.kubeconfig)
        .args(["virt", "vnc", "vnc", "--proxy-only", "--port"])
        .arg(port.to_string())
        .args(["-n", &ns.name])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl virt vnc");
    // It says where it listens (JSON, like virtctl) once it does.
    let mut line = Vec::new();
    let mut stdout = proxy.stdout.take().unwrap();
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    let said: serde_json::Value = serde_json::from_slice(&line)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&line)));
    assert_eq!(said["port"], port);

    let mut tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect to the proxy");
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut version = [0u8; 12];
    tcp.read_exact(&mut version).expect("RFB version from QEMU");
    assert_eq!(&version, b"RFB 003.008\n");
    // The client's version, then the server lists its security types (RFB 3.8 §7.1.2).
    tcp.write_all(b"RFB 003.008\n").unwrap();
    let mut count = [0u8; 1];
    tcp.read_exact(&mut count).expect("security types");
    assert!(count[0] > 0, "no security types offered");
    let mut types = vec![0u8; usize::from(count[0])];
    tcp.read_exact(&mut types).unwrap();
    assert!(types.contains(&1), "no 'None' security type: {types:?}");
    drop(tcp);
    let _ = proxy.kill();
    let _ = proxy.wait();
}

/// A refusal: exit code 1 and a message containing each of `want`.
fn assert_refused(got: (Option<i32>, String, String), what: &str, want: &[&str]) {
    let (code, out, err) = got;
    assert_eq!(
        code,
        Some(1),
        "{what}: exit code; stdout {out:?} stderr {err:?}"
    );
    for w in want {
        assert!(err.contains(w), "{what}: {w:?} not in {err:?}");
    }
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn errors_say_what_to_fix_and_exit_1() {
    let c = cluster();
    let ns = Ns::new(c, "errors");
    let other = Ns::new(c, "errors-other");
    ns.apply_vm("halted", "Halted");
    ns.wait("halted", "VM halted Stopped", GONE, || {
        ns.vm_status("halted") == "Stopped"
    });

    // The VM exists, but not where the user looks.
    assert_refused(
        kubectl_virt(c, &["start", "halted", "-n", &other.name]),
        "wrong namespace",
        &[&format!(
            "VM \"halted\" not found in namespace \"{}\"",
            other.name
        )],
    );
    assert_refused(
        ns.virt_result(&["stop", "missing"]),
        "missing VM",
        &[&format!(
            "VM \"missing\" not found in namespace \"{}\"",
            ns.name
        )],
    );
    assert_refused(
        ns.virt_result(&["console", "missing"]),
        "console of a missing VM",
        &["\"missing\" not found", &ns.name],
    );
    // Halted: no instance will come, so the console says so at once with the way out.
    assert_refused(
        ns.virt_result(&["console", "halted", "--timeout", "1"]),
        "console of a stopped VM",
        &["is not running", "kubectl virt start halted"],
    );
    // A user without kubevirt.io:edit (kube-apiserver's RBAC answers for the aggregated API).
    let nobody = "e2e-no-rights@example.com";
    assert_refused(
        ns.virt_result(&["start", "halted", "--as", nobody]),
        "start without RBAC",
        &[
            "permission denied",
            "virtualmachines/start",
            "subresources.kubevirt.io",
            &ns.name,
        ],
    );
    assert_refused(
        ns.virt_result(&["console", "halted", "--as", nobody]),
        "console without RBAC",
        &["permission denied", "virtualmachineinstances/console"],
    );
    assert_refused(
        ns.virt_result(&["port-forward", "--stdio", "vm/halted", "22", "--as", nobody]),
        "port-forward without RBAC",
        &["permission denied", "virtualmachines/portforward"],
    );
    // The same user with kubevirt.io:edit in the namespace may.
    ns.k(&[
        "create",
        "rolebinding",
        "e2e-edit",
        "--clusterrole=kubevirt.io:edit",
        &format!("--user={nobody}"),
    ])
    .expect("rolebinding");
    ns.wait(
        "halted",
        "start allowed with kubevirt.io:edit",
        GONE,
        || {
            ns.virt_result(&["start", "halted", "--dry-run", "--as", nobody])
                .0
                == Some(0)
        },
    );
    // Nothing was changed by the refused or dry-run calls.
    assert_eq!(ns.vm_status("halted"), "Stopped");
    assert_eq!(ns.vmi_uid("halted"), "");
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn start_paused_then_unpause_and_stop_show_in_kubectl_get_vm() {
    let c = cluster();
    let ns = Ns::new(c, "paused");
    ns.apply_vm("p", "Halted");
    ns.wait("p", "VM p Stopped", GONE, || ns.vm_status("p") == "Stopped");
    ns.virt(&["start", "p", "--paused"]);
    ns.wait("p", "VM p Paused", BOOT, || ns.vm_status("p") == "Paused");
    let printed = ns.k(&["get", "vm", "p"]).expect("get vm");
    assert!(printed.contains("Paused"), "{printed}");
    ns.virt(&["unpause", "vm", "p"]);
    ns.wait("p", "VM p Running", BOOT, || ns.vm_status("p") == "Running");
    ns.virt(&["stop", "p"]);
    ns.wait_stopped("p");
    let printed = ns.k(&["get", "vm", "p"]).expect("get vm");
    assert!(printed.contains("Stopped"), "{printed}");
}

/// The commands that print rather than act, against the cluster: `version` names the client
/// and the server the cluster runs, `completion bash` is a script bash accepts, and `create
/// vm` prints a manifest the API server takes as it is (applied, `kubectl get vm` shows it
/// with the run strategy asked for and the memory given).
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn version_completion_and_create_vm_against_the_cluster() {
    let c = cluster();
    let ns = Ns::new(c, "printing");
    let (code, out, err) = ns.virt_result(&["version"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.starts_with("Client Version: "), "{out}");
    assert!(
        out.contains("Server Version: {") && out.contains("gitVersion"),
        "the server's version is missing: {out}{err}"
    );

    let (code, script, err) = kubectl_virt(c, &["completion", "bash"]);
    assert_eq!(code, Some(0), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kubectl-virt.bash");
    std::fs::write(&file, &script).unwrap();
    let checked = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(
        checked.status.success() && script.contains("complete"),
        "bash -n: {}",
        String::from_utf8_lossy(&checked.stderr)
    );

    let (code, manifest, err) = ns.virt_result(&[
        "create",
        "vm",
        "--name",
        "printed",
        "--memory",
        "96Mi",
        "--run-strategy",
        "Halted",
        "--volume-containerdisk",
        &format!("src:{TEST_GUEST}"),
    ]);
    assert_eq!(code, Some(0), "{err}");
    c.kubectl_stdin(&["-n", &ns.name, "apply", "-f", "-"], Some(&manifest))
        .unwrap_or_else(|e| panic!("the printed manifest was refused: {e:#}\n{manifest}"));
    ns.wait("printed", "VM printed Stopped", GONE, || {
        ns.vm_status("printed") == "Stopped"
    });
    assert_eq!(ns.get("vm", "printed", "{.spec.runStrategy}"), "Halted");
    assert_eq!(
        ns.get("vm", "printed", "{.spec.template.spec.domain.memory.guest}"),
        "96Mi"
    );
}
