//! Live migration between two real launchers (private libvirtd + QEMU TCG each, sockets
//! in their own pod-style directories) through virt-handler's mTLS migration proxy:
//! no cluster, every other part real. Proves the guest is not rebooted (its uptime
//! keeps counting, a file in its tmpfs survives, a containerDisk write moves with it),
//! that a cancel or the target's death leaves it running on the source, and that no
//! QEMU or libvirtd is left behind.
//!
//! Needs root (namespaces) and the packages of docs/node.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use virt_domain::protocol::{
    MIGRATION_DIR, MigrateRequest, MigrationOptions, MigrationStatus, MigrationTarget, Request,
    Response,
};
use virt_handler::migration_proxy::{SourceProxy, TargetProxy, client_tls, server_tls};
use virt_testguest::{KERNEL_ARGS, PROMPT};

/// Two TCG guests per test already; tests run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn guest_dir() -> PathBuf {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests start private libvirtds in mount and PID namespaces and need root"
    );
    let dir = virt_testguest::default_dir();
    virt_testguest::ensure(&dir)
        .unwrap_or_else(|e| panic!("cannot build the test guest (cargo xtask guest): {e}"))
        .dir
}

fn vmi(name: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": format!("mig-{}", std::process::id()), "uid": "0b7a9c1e-2f4d-4e63-9a51-6d0c2b8f1a11"},
        "spec": {
            "terminationGracePeriodSeconds": 10,
            "domain": {
                "resources": {"requests": {"memory": "256Mi"}},
                "firmware": {"kernelBoot": {
                    "kernelArgs": KERNEL_ARGS,
                    "container": {"image": "guest:latest", "kernelPath": "/vmlinuz", "initrdPath": "/initramfs.gz"}
                }},
                "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}
            },
            "volumes": [{"name": "root", "containerDisk": {"image": "guest:latest"}}]
        }
    })
}

/// One launcher as its pod runs it: sockets in `dir` (the host's `sockets/<uid>/`).
struct Launcher {
    child: Option<Child>,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Launcher {
    fn start(vmi: &Value, images: &Path, target: bool) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("vl-mig-")
            .tempdir()
            .unwrap();
        let file = dir.path().join("vmi.json");
        std::fs::write(&file, serde_json::to_vec(vmi).unwrap()).unwrap();
        std::fs::create_dir(dir.path().join("work")).unwrap();
        // A file, not a pipe: a chatty launcher must never block on a full pipe.
        let log = dir.path().join("launcher.log");
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_virt-launcher"));
        cmd.arg("--vmi")
            .arg(&file)
            .arg("--console-socket")
            .arg(dir.path().join("console.sock"))
            .arg("--cmd-socket")
            .arg(dir.path().join("cmd.sock"))
            .arg("--image-dir")
            .arg(format!("guest:latest={}", images.display()))
            .arg("--work-dir")
            .arg(dir.path().join("work"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(out);
        if target {
            cmd.arg("--migration-target");
        }
        Self {
            child: Some(cmd.spawn().unwrap()),
            dir,
            log,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    fn wait_socket(&mut self, name: &str, timeout: Duration) -> PathBuf {
        let p = self.path(name);
        let start = Instant::now();
        while UnixStream::connect(&p).is_err() {
            if let Some(s) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "launcher exited with {s} before {name} came up:\n{}",
                    self.logs()
                );
            }
            assert!(
                start.elapsed() < timeout,
                "no {name} after {timeout:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    fn call(&self, req: &Request) -> Response {
        let mut s = UnixStream::connect(self.path("cmd.sock")).unwrap();
        s.write_all(&[serde_json::to_vec(req).unwrap(), b"\n".to_vec()].concat())
            .unwrap();
        let mut r = std::io::BufReader::new(s);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut r, &mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    fn console(&mut self) -> Console {
        let p = self.wait_socket("console.sock", Duration::from_secs(60));
        Console {
            s: UnixStream::connect(p).unwrap(),
            seen: String::new(),
        }
    }

    fn wait_exit(&mut self, timeout: Duration) -> i32 {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return s.code().unwrap_or(-1);
            }
            assert!(
                start.elapsed() < timeout,
                "launcher still runs after {timeout:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    /// No QEMU or libvirtd of this launcher (its console socket and work directory name
    /// them), no file left in its work directory and no migration sockets.
    fn assert_clean(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = processes_of(self.dir.path());
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "processes left behind: {left:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let files: Vec<_> = std::fs::read_dir(self.path("work")).unwrap().collect();
        assert!(files.is_empty(), "work directory not cleaned: {files:?}");
        assert!(!self.path("cmd.sock").exists(), "command socket left");
        assert!(!self.path("console.sock").exists(), "console socket left");
        assert!(
            !self.path(MIGRATION_DIR).exists(),
            "migration directory left"
        );
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Live QEMU / libvirtd processes whose command line names `dir`.
fn processes_of(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie
            && (cmd.contains("qemu-system") || cmd.contains("libvirtd"))
            && cmd.contains(&dir)
        {
            out.push(cmd);
        }
    }
    out
}

struct Console {
    s: UnixStream,
    seen: String,
}

impl Console {
    fn expect(&mut self, pat: &str, timeout: Duration) -> String {
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            if let Some(i) = self.seen.find(pat) {
                let out = self.seen[..i + pat.len()].to_string();
                self.seen.drain(..i + pat.len());
                return out;
            }
            let left = timeout.checked_sub(start.elapsed()).unwrap_or_else(|| {
                panic!("{pat:?} not seen within {timeout:?}; got {:?}", self.seen)
            });
            self.s
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match self.s.read(&mut buf) {
                Ok(0) => panic!("console closed before {pat:?}; got {:?}", self.seen),
                Ok(n) => self.seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("console read: {e}"),
            }
        }
    }

    fn send(&mut self, line: &str) {
        self.s.write_all(format!("{line}\n").as_bytes()).unwrap();
    }

    fn prompt(&mut self) {
        let start = Instant::now();
        loop {
            self.send("");
            let mut buf = [0u8; 4096];
            self.s
                .set_read_timeout(Some(Duration::from_secs(3)))
                .unwrap();
            if let Ok(n) = self.s.read(&mut buf) {
                assert!(n > 0, "console closed before the prompt");
                self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            if let Some(i) = self.seen.rfind(PROMPT) {
                self.seen.drain(..i + PROMPT.len());
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "no prompt: {:?}",
                self.seen
            );
        }
    }

    fn run(&mut self, cmd: &str) -> String {
        self.send(&format!("{cmd}; echo __done__$((1+1))"));
        self.expect("__done__2", Duration::from_secs(30))
            .replace('\r', "")
    }

    /// The guest's uptime in seconds.
    fn uptime(&mut self) -> f64 {
        let out = self.run("cat /proc/uptime");
        out.lines()
            .filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok())
            .next()
            .unwrap_or_else(|| panic!("no uptime in {out:?}"))
    }
}

/// The two handlers' proxies, with certificates of one CA (as the handlers' are).
struct Proxies {
    _target: TargetProxy,
    _source: SourceProxy,
}

/// A launcher's migration directory as virt-handler opens it.
fn migration_dir(l: &Launcher) -> std::sync::Arc<virt_handler::launcher_fs::SocketsDir> {
    let dir = virt_handler::launcher_fs::SocketsDir::at(l.dir.path()).unwrap();
    std::sync::Arc::new(dir.make_subdir(MIGRATION_DIR).unwrap())
}

fn proxies(source: &Launcher, target: &Launcher) -> Proxies {
    let validity = time::Duration::days(1);
    let ca = virt_certs::Ca::generate("kubevirt-rs-ca", validity).unwrap();
    let a = ca.issue_handler("node-a", validity).unwrap();
    let b = ca.issue_handler("node-b", validity).unwrap();
    let ca_pem = ca.cert_pem().as_bytes();
    let stls = server_tls(b.cert_pem.as_bytes(), b.key_pem.as_bytes(), ca_pem).unwrap();
    let ctls = client_tls(a.cert_pem.as_bytes(), a.key_pem.as_bytes(), ca_pem).unwrap();
    let t = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(TargetProxy::start(
            "127.0.0.1:0".parse().unwrap(),
            stls,
            migration_dir(target),
            virt_certs::node_identity::common_name("node-a"),
        ))
    })
    .unwrap();
    let s = SourceProxy::start(
        migration_dir(source),
        t.addr(),
        ctls,
        rustls_pki_types::ServerName::try_from("node-b").unwrap(),
    )
    .unwrap();
    Proxies {
        _target: t,
        _source: s,
    }
}

fn prepare(target: &mut Launcher) -> MigrationTarget {
    target.wait_socket("cmd.sock", Duration::from_secs(60));
    match target.call(&Request::PrepareMigrationTarget) {
        Response::MigrationTargetReady(t) => t,
        other => panic!("prepare: {other:?}\n{}", target.logs()),
    }
}

/// Follows `watchMigration` to the end; returns every status seen.
fn watch(source: &Launcher, timeout: Duration) -> Vec<MigrationStatus> {
    let mut s = UnixStream::connect(source.path("cmd.sock")).unwrap();
    s.set_read_timeout(Some(timeout)).unwrap();
    s.write_all(b"{\"op\":\"watchMigration\"}\n").unwrap();
    let r = std::io::BufReader::new(s);
    let mut seen = Vec::new();
    for line in std::io::BufRead::lines(r) {
        let line = line.unwrap_or_else(|e| panic!("watchMigration: {e}\n{}", source.logs()));
        match serde_json::from_str(&line).unwrap() {
            Response::Migration(st) => {
                let end = st.is_final();
                seen.push(st);
                if end {
                    break;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    seen
}

fn migrate(source: &Launcher, target: MigrationTarget, options: MigrationOptions) {
    match source.call(&Request::Migrate(MigrateRequest { target, options })) {
        Response::Ok => {}
        other => panic!("migrate: {other:?}\n{}", source.logs()),
    }
}

fn running_qemu(l: &Launcher) -> bool {
    processes_of(l.dir.path())
        .iter()
        .any(|c| c.contains("qemu-system"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_migration_moves_the_running_guest() {
    let _g = SERIAL.lock().await;
    let images = guest_dir();
    let v = vmi("mover");
    let mut a = Launcher::start(&v, &images, false);
    let mut b = Launcher::start(&v, &images, true);
    let mut ca = a.console();
    ca.prompt();
    // State that only this boot has: a file in the guest's RAM, a write to the
    // containerDisk overlay (the disk copy must carry it).
    ca.run("echo still-here > /tmp/marker; echo moved-disk | dd of=/dev/vda bs=512 seek=100 conv=fsync 2>/dev/null");
    let before = ca.uptime();
    let t = prepare(&mut b);
    assert!(
        !running_qemu(&b),
        "the target must not boot a guest of its own"
    );
    let _p = proxies(&a, &b);
    let t0 = Instant::now();
    migrate(&a, t, MigrationOptions::default());
    let seen = tokio::task::block_in_place(|| watch(&a, Duration::from_secs(180)));
    let took = t0.elapsed();
    let Some(MigrationStatus::Completed { progress }) = seen.last().cloned() else {
        std::thread::sleep(Duration::from_secs(2));
        panic!(
            "migration did not complete: {seen:?}\nsource:\n{}\ntarget:\n{}",
            a.logs(),
            b.logs()
        );
    };
    eprintln!(
        "migration took {took:?} (libvirt: {} ms), downtime {:?} ms, {} bytes, {} progress reports, iterations {}",
        progress.elapsed_ms,
        progress.downtime_ms,
        progress.data_processed,
        seen.len(),
        progress.memory_iteration
    );
    assert!(progress.data_processed > 0, "{progress:?}");
    // The source's QEMU is gone at once, but the launcher waits for its pod's deletion
    // (cluster-flow.md §6.5), saying the guest moved.
    let deadline = Instant::now() + Duration::from_secs(10);
    while running_qemu(&a) {
        assert!(Instant::now() < deadline, "the source QEMU is still there");
        std::thread::sleep(Duration::from_millis(50));
    }
    match a.call(&Request::GetStatus) {
        Response::Status(s) => {
            assert_eq!(s.state, virt_domain::protocol::DomainState::Migrated)
        }
        other => panic!("{other:?}"),
    }
    a.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(a.wait_exit(Duration::from_secs(30)), 0, "{}", a.logs());
    assert_eq!(
        std::fs::read_to_string(a.path("outcome.json")).unwrap(),
        r#"{"outcome":"migrated"}"#
    );
    let _ = std::fs::remove_file(a.path("outcome.json"));
    a.assert_clean();
    // Same guest on B: not rebooted.
    match b.call(&Request::GetStatus) {
        Response::Status(s) => {
            assert_eq!(s.state, virt_domain::protocol::DomainState::Running)
        }
        other => panic!("{other:?}"),
    }
    let mut cb = b.console();
    cb.prompt();
    let after = cb.uptime();
    assert!(
        after > before,
        "uptime went back: {before} → {after} (rebooted?)"
    );
    let out =
        cb.run("cat /tmp/marker; dd if=/dev/vda bs=512 skip=100 count=1 2>/dev/null | head -c 10");
    assert!(
        out.contains("still-here"),
        "guest memory not carried: {out}"
    );
    assert!(out.contains("moved-disk"), "disk write not carried: {out}");
    eprintln!("uptime before {before}, after {after}");
    // And on again from the former target (migrating back): a launcher that received
    // its guest sends it on like any other.
    drop(cb);
    let mut c = Launcher::start(&v, &images, true);
    let tc = prepare(&mut c);
    let _p2 = proxies(&b, &c);
    migrate(&b, tc, MigrationOptions::default());
    let seen = tokio::task::block_in_place(|| watch(&b, Duration::from_secs(180)));
    assert!(
        matches!(seen.last(), Some(MigrationStatus::Completed { .. })),
        "second migration: {seen:?}\nfrom:\n{}\nto:\n{}",
        b.logs(),
        c.logs()
    );
    let mut cc = c.console();
    cc.prompt();
    let again = cc.uptime();
    assert!(again > after, "uptime went back: {after} → {again}");
    c.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(c.wait_exit(Duration::from_secs(30)), 0, "{}", c.logs());
    let _ = std::fs::remove_file(c.path("outcome.json"));
    c.assert_clean();
    b.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(b.wait_exit(Duration::from_secs(30)), 0, "{}", b.logs());
    let _ = std::fs::remove_file(b.path("outcome.json"));
    b.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_migration_leaves_the_guest_on_the_source() {
    let _g = SERIAL.lock().await;
    let images = guest_dir();
    let v = vmi("stayer");
    let mut a = Launcher::start(&v, &images, false);
    let mut b = Launcher::start(&v, &images, true);
    let mut ca = a.console();
    ca.prompt();
    let before = ca.uptime();
    let t = prepare(&mut b);
    let _p = proxies(&a, &b);
    // 1 MiB/s: the guest's non-zero memory takes tens of seconds.
    migrate(
        &a,
        t,
        MigrationOptions {
            bandwidth_mib: Some(1),
            max_downtime_ms: None,
            copy_claims: Vec::new(),
        },
    );
    let seen = tokio::task::block_in_place(|| {
        let mut s = UnixStream::connect(a.path("cmd.sock")).unwrap();
        s.write_all(b"{\"op\":\"watchMigration\"}\n").unwrap();
        let mut r = std::io::BufReader::new(s);
        // Wait until data flows (or 3 s have passed: a cancel is valid in any phase of
        // the job), then cancel.
        let started = Instant::now();
        let mut early = Vec::new();
        r.get_ref()
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        while started.elapsed() < Duration::from_secs(3) {
            let mut line = String::new();
            if std::io::BufRead::read_line(&mut r, &mut line).is_err() || line.is_empty() {
                continue;
            }
            let st: Response = serde_json::from_str(&line).unwrap();
            early.push(st.clone());
            match st {
                Response::Migration(MigrationStatus::Running { progress })
                    if progress.data_processed > 1 << 20 =>
                {
                    break;
                }
                Response::Migration(st) if st.is_final() => {
                    panic!("ended before the cancel: {st:?}\n{}", a.logs())
                }
                _ => {}
            }
        }
        eprintln!("before the cancel: {early:?}");
        let t0 = Instant::now();
        match a.call(&Request::CancelMigration) {
            Response::Ok => {}
            other => panic!("cancel: {other:?}\n{}", a.logs()),
        }
        let seen = watch(&a, Duration::from_secs(60));
        eprintln!("cancel → cancelled in {:?}", t0.elapsed());
        seen
    });
    assert_eq!(seen.last(), Some(&MigrationStatus::Cancelled), "{seen:?}");
    // Still on A, still the same boot.
    let after = ca.uptime();
    assert!(after > before, "{before} → {after}");
    assert!(ca.run("echo $((6*7))").contains("42"));
    assert!(!running_qemu(&b), "the target kept a QEMU after the cancel");
    for l in [&a, &b] {
        l.signal(nix::sys::signal::Signal::SIGTERM);
    }
    assert_eq!(a.wait_exit(Duration::from_secs(30)), 0, "{}", a.logs());
    assert_eq!(b.wait_exit(Duration::from_secs(30)), 0, "{}", b.logs());
    for l in [&a, &b] {
        let _ = std::fs::remove_file(l.path("outcome.json"));
        l.assert_clean();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_target_leaves_the_guest_on_the_source() {
    let _g = SERIAL.lock().await;
    let images = guest_dir();
    let v = vmi("survivor");
    let mut a = Launcher::start(&v, &images, false);
    let mut b = Launcher::start(&v, &images, true);
    let mut ca = a.console();
    ca.prompt();
    let before = ca.uptime();
    let t = prepare(&mut b);
    let _p = proxies(&a, &b);
    migrate(
        &a,
        t,
        MigrationOptions {
            bandwidth_mib: Some(1),
            max_downtime_ms: None,
            copy_claims: Vec::new(),
        },
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        running_qemu(&b),
        "no incoming QEMU on the target mid-migration"
    );
    b.signal(nix::sys::signal::Signal::SIGKILL);
    let t0 = Instant::now();
    let seen = tokio::task::block_in_place(|| watch(&a, Duration::from_secs(120)));
    let Some(MigrationStatus::Failed { reason }) = seen.last() else {
        panic!("{seen:?}\n{}", a.logs());
    };
    eprintln!("source saw the failure after {:?}: {reason}", t0.elapsed());
    let after = ca.uptime();
    assert!(after > before, "{before} → {after}");
    assert!(ca.run("echo $((6*7))").contains("42"));
    b.wait_exit(Duration::from_secs(10));
    // kill -9 leaves the target's files, but no process.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_of(b.dir.path()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            processes_of(b.dir.path())
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    a.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(a.wait_exit(Duration::from_secs(30)), 0, "{}", a.logs());
    let _ = std::fs::remove_file(a.path("outcome.json"));
    a.assert_clean();
}

/// The same move driven by virt-handler's own functions (`prepare_target`, `run_source`),
/// as the two handlers will in cluster mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handler_functions_drive_the_migration() {
    use virt_handler::client::LauncherClient;
    use virt_handler::launcher_fs::{LauncherDir, Location};
    use virt_handler::migration::{prepare_target, run_source};
    let _g = SERIAL.lock().await;
    let images = guest_dir();
    let v = vmi("driven");
    let mut a = Launcher::start(&v, &images, false);
    let mut b = Launcher::start(&v, &images, true);
    let mut ca = a.console();
    ca.prompt();
    let before = ca.uptime();
    b.wait_socket("cmd.sock", Duration::from_secs(60));
    let validity = time::Duration::days(1);
    let ca_cert = virt_certs::Ca::generate("kubevirt-rs-ca", validity).unwrap();
    let ha = ca_cert.issue_handler("node-a", validity).unwrap();
    let hb = ca_cert.issue_handler("node-b", validity).unwrap();
    let pem = ca_cert.cert_pem().as_bytes();
    let (target_proxy, target) = prepare_target(
        &LauncherClient::new(LauncherDir::new(Location::Host(b.dir.path().into()))),
        "127.0.0.1:0".parse().unwrap(),
        server_tls(hb.cert_pem.as_bytes(), hb.key_pem.as_bytes(), pem).unwrap(),
        "node-a",
    )
    .await
    .unwrap();
    let mut reports = 0;
    let last = run_source(
        &LauncherClient::new(LauncherDir::new(Location::Host(a.dir.path().into()))),
        target_proxy.addr(),
        client_tls(ha.cert_pem.as_bytes(), ha.key_pem.as_bytes(), pem).unwrap(),
        "node-b",
        MigrateRequest {
            target,
            options: MigrationOptions::default(),
        },
        |_| reports += 1,
    )
    .await
    .unwrap();
    assert!(
        matches!(last, MigrationStatus::Completed { .. }),
        "{last:?}\n{}",
        a.logs()
    );
    assert!(reports >= 2, "{reports}");
    let mut cb = b.console();
    cb.prompt();
    let after = cb.uptime();
    assert!(after > before, "{before} → {after}");
    for l in [&a, &b] {
        l.signal(nix::sys::signal::Signal::SIGTERM);
    }
    assert_eq!(a.wait_exit(Duration::from_secs(30)), 0, "{}", a.logs());
    assert_eq!(b.wait_exit(Duration::from_secs(30)), 0, "{}", b.logs());
    for l in [&a, &b] {
        let _ = std::fs::remove_file(l.path("outcome.json"));
        l.assert_clean();
    }
}
