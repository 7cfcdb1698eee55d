//! Helpers for the end-to-end tests: a cluster (the one named by `KUBECONFIG`, or our local one,
//! brought up on demand with `cargo xtask cluster up`), kubectl, and images from local files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => workspace_root().join(t),
        None => workspace_root().join("target"),
    }
}

/// The variable naming the file [`skip`] appends to (`cargo xtask test` sets it and counts the
/// lines as skipped tests, not passed ones).
pub const SKIPS_FILE_ENV: &str = "E2E_SKIPS_FILE";

/// Records that `test` checked nothing for `reason` (a cluster without what it needs) and
/// says so: libtest counts a test that returns early as passed, so without this a skip is
/// silent. Call it, then return.
pub fn skip(test: &str, reason: &str) {
    eprintln!("skipped {test}: {reason}");
    let file = std::env::var_os(SKIPS_FILE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("e2e-skips.log"));
    let line = serde_json::json!({"test": test, "reason": reason}).to_string();
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        eprintln!("recording the skip in {}: {e}", file.display());
    }
}

/// Runs `cargo xtask ARGS` in the workspace. Its output is passed on as it comes (so libtest
/// shows it with a failing test) and its last lines are part of the error: a CI summary that
/// shows only the panic message still names the cause.
/// `cargo` without the variables cargo set for this test process (`xtask::cargo`): a build
/// started from here then matches one started by `cargo xtask` and reuses it.
pub fn cargo() -> Command {
    xtask::cargo()
}

pub fn xtask(args: &[&str]) -> anyhow::Result<()> {
    const TAIL: usize = 40;
    let mut child = cargo()
        .arg("xtask")
        .args(args)
        .current_dir(workspace_root())
        // The error's own lines, not a backtrace, must be what the tail keeps.
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running cargo xtask")?;
    let tail = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    let forward = |pipe: Box<dyn std::io::Read + Send>| {
        let tail = tail.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                eprintln!("{line}");
                let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                if t.len() == TAIL {
                    t.pop_front();
                }
                t.push_back(line);
            }
        })
    };
    let readers = [
        child.stdout.take().map(|p| forward(Box::new(p))),
        child.stderr.take().map(|p| forward(Box::new(p))),
    ];
    let status = child.wait().context("waiting for cargo xtask")?;
    for r in readers.into_iter().flatten() {
        let _ = r.join();
    }
    if !status.success() {
        let t = tail.lock().unwrap_or_else(|p| p.into_inner());
        let lines: Vec<&str> = t.iter().map(String::as_str).collect();
        bail!(
            "cargo xtask {} failed ({status}); its last lines:\n{}",
            args.join(" "),
            lines.join("\n")
        );
    }
    Ok(())
}

/// A cluster to test against.
#[derive(Debug)]
pub struct Cluster {
    pub kubeconfig: PathBuf,
    kubectl: PathBuf,
    /// Whether it is our local cluster (then images are imported with `cargo xtask cluster import`).
    pub local: bool,
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
static KUBEVIRT: OnceLock<Result<(), String>> = OnceLock::new();

impl Cluster {
    /// The cluster named by `KUBECONFIG`, or the local one (brought up if needed). Shared by all
    /// tests of a binary.
    pub fn get() -> anyhow::Result<&'static Cluster> {
        CLUSTER
            .get_or_init(|| Self::connect().map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    fn connect() -> anyhow::Result<Cluster> {
        let kubectl = find_kubectl();
        if let Some(kc) = std::env::var_os("KUBECONFIG").filter(|k| !k.is_empty()) {
            let kubeconfig = PathBuf::from(kc);
            let ours = target_dir().join("cluster/kubeconfig");
            let local = kubeconfig.canonicalize().ok() == ours.canonicalize().ok() && ours.exists();
            return Ok(Cluster {
                kubeconfig,
                kubectl: kubectl?,
                local,
            });
        }
        xtask(&["cluster", "up"])?;
        Ok(Cluster {
            kubeconfig: target_dir().join("cluster/kubeconfig"),
            // `cluster up` has built one if there was none.
            kubectl: find_kubectl()?,
            local: true,
        })
    }

    /// The cluster with kubevirt-rs installed through virt-operator (`cargo xtask deploy`:
    /// idempotent, so an installation that is current is only checked).
    pub fn with_kubevirt() -> anyhow::Result<&'static Cluster> {
        let c = Self::get()?;
        KUBEVIRT
            .get_or_init(|| c.deploy_kubevirt().map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(c)
    }

    /// (Re)installs kubevirt-rs as every e2e test expects it (`cargo xtask deploy`).
    pub fn deploy_kubevirt(&self) -> anyhow::Result<()> {
        let kubeconfig = self.kubeconfig.to_string_lossy().into_owned();
        // HostDisk: the migration tests need a VM whose disk cannot move (the gate's
        // refusal itself is tested against the real server in apiserver/server/tests).
        xtask(&[
            "deploy",
            "--kubeconfig",
            &kubeconfig,
            "--feature-gates",
            "HostDisk,HotplugVolumes",
        ])
    }

    /// Runs kubectl and returns whether it succeeded, its stdout and its stderr: for the tests
    /// that expect a refusal.
    pub fn kubectl_result(&self, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
        self.kubectl_stdin_result(args, "")
    }

    /// [`Self::kubectl_result`] with `stdin` as input.
    pub fn kubectl_stdin_result(
        &self,
        args: &[&str],
        stdin: &str,
    ) -> anyhow::Result<(bool, String, String)> {
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", self.kubectl.display()))?;
        if let Some(mut pipe) = child.stdin.take() {
            pipe.write_all(stdin.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// The kubectl binary the helpers run.
    pub fn kubectl_path(&self) -> &Path {
        &self.kubectl
    }

    /// The local cluster's PKI directory (front-proxy client certificate etc.), if this is it.
    pub fn local_pki(&self) -> Option<PathBuf> {
        self.local
            .then(|| target_dir().join("cluster/state/pki"))
            .filter(|p| p.exists())
    }

    /// The CA bundle virt-handlers' certificates chain to (ConfigMap `virt-handler-ca`).
    pub fn handler_ca_bundle(&self) -> anyhow::Result<String> {
        self.kubectl(&[
            "-n",
            "kubevirt",
            "get",
            "configmap",
            "virt-handler-ca",
            "-o",
            "jsonpath={.data.ca\\.crt}",
        ])
    }

    /// Runs kubectl against the cluster and returns its stdout.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        self.kubectl_stdin(args, None)
    }

    /// A jsonpath over the pods of one kubevirt-rs component (`app.kubernetes.io/name`) in
    /// namespace kubevirt; `running_only` skips pods not (or no longer) Running.
    pub fn component_pods(
        &self,
        component: &str,
        running_only: bool,
        jsonpath: &str,
    ) -> anyhow::Result<String> {
        let selector = format!("app.kubernetes.io/name={component}");
        let jsonpath = format!("jsonpath={jsonpath}");
        let mut args = vec!["-n", "kubevirt", "get", "pods", "-l", selector.as_str()];
        if running_only {
            args.push("--field-selector=status.phase=Running");
        }
        args.extend(["-o", jsonpath.as_str()]);
        self.kubectl(&args)
    }

    /// Runs kubectl with `stdin` as its input (e.g. `apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", self.kubectl.display()))?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Polls `f` until it returns true or `timeout` passes.
    pub fn eventually(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut() -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            match f() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last = format!("{e:#}"),
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        bail!("{what} not reached within {timeout:?} {last}")
    }

    /// Loads an OCI archive into the cluster's container runtime. For a cluster that is not our
    /// local one, `E2E_IMAGE_LOAD` names the command (the archive is appended), e.g.
    /// `kind load image-archive --name kubevirt-rs`.
    pub fn load_image(&self, archive: &Path) -> anyhow::Result<()> {
        if let Ok(cmd) = std::env::var("E2E_IMAGE_LOAD") {
            let mut parts = cmd.split_whitespace();
            let program = parts.next().context("E2E_IMAGE_LOAD is empty")?;
            let status = Command::new(program).args(parts).arg(archive).status()?;
            if !status.success() {
                bail!("{cmd} {} failed", archive.display());
            }
            return Ok(());
        }
        if !self.local {
            bail!("KUBECONFIG names another cluster: set E2E_IMAGE_LOAD to load images into it");
        }
        // What `cargo xtask cluster import` does, without a nested cargo (slow while other
        // builds hold the build directory lock): into every node's containerd (a second
        // node has its own, `containerd-2.sock`), or a pod scheduled there finds no image.
        let run = target_dir().join("cluster/state/run");
        for socket in ["containerd.sock", "containerd-2.sock"] {
            let socket = run.join(socket);
            if socket != run.join("containerd.sock") && !socket.exists() {
                continue;
            }
            let out = Command::new("ctr")
                .arg("--address")
                .arg(&socket)
                .args(["--namespace", "k8s.io", "images", "import"])
                .arg(archive)
                .output()
                .context("running ctr")?;
            if !out.status.success() {
                bail!(
                    "importing {} into {}: {}",
                    archive.display(),
                    socket.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        Ok(())
    }
}

/// kubectl for the tests: `$KUBECTL` (`cargo xtask test` exports the cluster's), else the
/// one `cargo xtask cluster up` builds under `target/k8s/<version>/bin/`. Never a guess on
/// PATH: a fresh machine has none, and another version would test something else.
pub fn find_kubectl() -> anyhow::Result<PathBuf> {
    if let Some(k) = std::env::var_os("KUBECTL").filter(|k| !k.is_empty()) {
        return Ok(k.into());
    }
    let k8s = target_dir().join("k8s");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&k8s)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/kubectl"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop().with_context(|| {
        format!(
            "no kubectl: set KUBECTL to one, or build the cluster's with `cargo xtask cluster up` \
             (it lands in {}/<version>/bin/)",
            k8s.display()
        )
    })
}

/// [`find_kubectl`] for a test: fails it, saying how to get one, when there is none.
pub fn kubectl_binary() -> PathBuf {
    find_kubectl().unwrap_or_else(|e| panic!("{e:#}"))
}

/// Builds an image FROM scratch holding busybox-static (as /bin/busybox, the entrypoint) and
/// writes it as an OCI archive into `dir`. Returns the archive's path.
pub fn busybox_image(name: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        bail!("/bin/busybox missing (apt-get install busybox-static)");
    }
    scratch_image(name, &[(busybox, "/bin/busybox")], &["/bin/busybox"], dir)
}

/// Builds an image FROM scratch holding `files` (host path, image path) with `entrypoint`, and
/// writes it as an OCI archive into `dir`. Returns the archive's path.
pub fn scratch_image(
    name: &str,
    files: &[(&Path, &str)],
    entrypoint: &[&str],
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let store = dir.join("buildah");
    let archive = dir.join("image.oci.tar");
    let buildah = |args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new("buildah")
            .arg("--storage-driver=vfs")
            .arg("--root")
            .arg(store.join("root"))
            .arg("--runroot")
            .arg(store.join("run"))
            .args(args)
            .output()
            .context("running buildah")?;
        if !out.status.success() {
            bail!(
                "buildah {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let ctr = buildah(&["from", "scratch"])?;
    for (host, image) in files {
        let host = host.to_string_lossy();
        buildah(&["copy", &ctr, &host, image])?;
    }
    let entrypoint = serde_json::to_string(entrypoint)?;
    buildah(&["config", "--entrypoint", &entrypoint, &ctr])?;
    buildah(&["commit", "--quiet", &ctr, name])?;
    let dest = format!("oci-archive:{}:{name}", archive.display());
    buildah(&["push", "--quiet", name, &dest])?;
    let _ = std::fs::remove_dir_all(&store);
    Ok(archive)
}

fn go() -> anyhow::Result<&'static str> {
    ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|g| {
            Command::new(g)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .context("Go is not installed (https://go.dev/dl/, unpacked to /usr/local/go)")
}

/// The upstream KubeVirt release whose `virtctl` the e2e tests drive (`e2e/virtctl/go.mod`).
pub const VIRTCTL_VERSION: &str = "v1.6.0";

/// Upstream `virtctl`, built once from the `kubevirt.io/kubevirt` Go module pinned in
/// `e2e/virtctl` into `target/virtctl/` (about 2 minutes and 80 MB of modules the first
/// time), with the version stamp its own release build sets.
pub fn upstream_virtctl() -> anyhow::Result<PathBuf> {
    let out = target_dir()
        .join("virtctl")
        .join(format!("virtctl-{VIRTCTL_VERSION}"));
    if out.is_file() {
        return Ok(out);
    }
    // Test binaries beside each other ask at once on a fresh machine: one builds while the
    // others wait for it (two builds into one partial file made the slower one's rename fail).
    let dir = out.parent().context("virtctl's directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let lock = std::fs::File::create(out.with_extension("lock")).context("virtctl's lock file")?;
    lock.lock()
        .context("waiting for another build of virtctl")?;
    if out.is_file() {
        return Ok(out);
    }
    let v = "kubevirt.io/client-go/version";
    let partial = out.with_extension(format!("partial-{}", std::process::id()));
    let status = Command::new(go()?)
        .args(["build", "-trimpath", "-ldflags"])
        .arg(format!(
            "-s -w -X {v}.gitVersion={VIRTCTL_VERSION} -X {v}.gitTreeState=clean"
        ))
        .arg("-o")
        .arg(&partial)
        .arg("kubevirt.io/kubevirt/cmd/virtctl")
        .current_dir(workspace_root().join("e2e/virtctl"))
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", "local")
        .status()
        .context("running go build")?;
    if !status.success() {
        bail!("go build of upstream virtctl {VIRTCTL_VERSION} failed");
    }
    std::fs::rename(&partial, &out).context("moving virtctl into place")?;
    Ok(out)
}

/// Builds a static Go program of the `e2e/k8s` module (e.g. `./cmd/aggregation-probe`) into
/// `dir` and returns the binary's path.
pub fn go_program(package: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let go = go()?;
    let name = package.rsplit('/').next().unwrap_or("program");
    let out = dir.join(name);
    let status = Command::new(go)
        .args(["build", "-trimpath", "-ldflags=-s -w", "-o"])
        .arg(&out)
        .arg(package)
        .current_dir(workspace_root().join("e2e/k8s"))
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", "local")
        .status()
        .context("running go build")?;
    if !status.success() {
        bail!("go build {package} failed");
    }
    Ok(out)
}

/// SIGKILLs every process named `comm` in the local cluster's containers (not the
/// virt-apiserver processes tests on this host start themselves) and returns how many.
pub use virt_devenv::procs::kill_in_containers;
