//! Builds the pinned Kubernetes release from the `k8s.io/kubernetes` Go module (GitHub is not
//! reachable from our machines, the Go module proxy is) and caches the binaries per version.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use super::{Layout, Progress};

/// The binaries we build; kubectl too, so that the client matches the server's version.
pub const BINARIES: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
];

/// The release pinned in e2e/k8s/go.mod, e.g. `v1.34.4`.
pub fn pinned_version(layout: &Layout) -> anyhow::Result<String> {
    let go_mod = layout.k8s_module.join("go.mod");
    let text =
        fs::read_to_string(&go_mod).with_context(|| format!("reading {}", go_mod.display()))?;
    text.lines()
        .find_map(|l| {
            let l = l.trim().strip_prefix("require").unwrap_or(l.trim()).trim();
            l.strip_prefix("k8s.io/kubernetes ")
                .map(|v| v.split_whitespace().next().unwrap_or_default().to_string())
        })
        .filter(|v| v.starts_with('v'))
        .with_context(|| {
            format!(
                "no `require k8s.io/kubernetes vX.Y.Z` in {}",
                go_mod.display()
            )
        })
}

/// Directory holding the binaries of the pinned version.
pub fn bin_dir(layout: &Layout, version: &str) -> PathBuf {
    layout.target.join("k8s").join(version).join("bin")
}

/// Hash of the inputs (go.mod, go.sum, the binary list): a change means a rebuild.
fn fingerprint(layout: &Layout) -> anyhow::Result<String> {
    let mut h = Sha256::new();
    for f in ["go.mod", "go.sum"] {
        h.update(fs::read(layout.k8s_module.join(f))?);
    }
    h.update(BINARIES.join(",").as_bytes());
    Ok(hex::encode(h.finalize()))
}

/// Finds the Go toolchain: PATH first, then the official tarball's location.
pub fn go_binary() -> Option<PathBuf> {
    super::which("go").or_else(|| {
        let p = PathBuf::from("/usr/local/go/bin/go");
        p.exists().then_some(p)
    })
}

/// Makes sure the binaries for the pinned version exist, building them if needed. Returns the
/// directory holding them.
pub fn ensure(layout: &Layout, progress: &Progress) -> anyhow::Result<PathBuf> {
    let version = pinned_version(layout)?;
    let dir = bin_dir(layout, &version);
    let stamp = dir.join(".fingerprint");
    let want = fingerprint(layout)?;
    let complete = BINARIES.iter().all(|b| dir.join(b).exists());
    if complete && fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) {
        progress.step(&format!(
            "Kubernetes {version} binaries cached in {}",
            dir.display()
        ));
        return Ok(dir);
    }
    let go = go_binary().context(
        "Go is not installed: install Go >= 1.24 (https://go.dev/dl/, unpacked to /usr/local/go)",
    )?;
    let fresh = !layout.go_cache_warm();
    progress.step(&format!(
        "building Kubernetes {version}{}…",
        if fresh {
            " (first time: 5–12 min on 2 cores)"
        } else {
            ""
        }
    ));
    let started = Instant::now();
    let tmp = dir.with_file_name("bin.partial");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    let log_path = dir.with_file_name("build.log");
    let log = fs::File::create(&log_path)?;
    let (major, minor) = major_minor(&version)?;
    let ldflags = format!(
        "-s -w -X k8s.io/component-base/version.gitVersion={version} \
         -X k8s.io/component-base/version.gitMajor={major} \
         -X k8s.io/component-base/version.gitMinor={minor} \
         -X k8s.io/component-base/version.gitTreeState=clean"
    );
    let mut cmd = Command::new("nice");
    cmd.arg("-n")
        .arg("10")
        .arg(&go)
        .args(["build", "-trimpath", "-ldflags", &ldflags, "-o"])
        .arg(format!("{}/", tmp.display()))
        .args(
            BINARIES
                .iter()
                .map(|b| format!("k8s.io/kubernetes/cmd/{b}")),
        )
        .current_dir(&layout.k8s_module)
        // Static binaries: they must not depend on the host's libc, and no C compiler is needed.
        .env("CGO_ENABLED", "0")
        // The go.mod pins the toolchain floor; never let Go try to download another one.
        .env("GOTOOLCHAIN", "local")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut child = cmd.spawn().context("starting go build")?;
    let mut last_note = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if last_note.elapsed() > Duration::from_secs(30) {
            progress.note(&format!(
                "still building Kubernetes {version} ({:.0} s so far; log: {})",
                started.elapsed().as_secs_f64(),
                log_path.display()
            ));
            last_note = Instant::now();
        }
        sleep(Duration::from_millis(500));
    };
    if !status.success() {
        bail!(
            "building Kubernetes {version} failed; see {}\n{}",
            log_path.display(),
            super::daemon::tail(&log_path, 20)
        );
    }
    fs::write(tmp.join(".fingerprint"), &want)?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&tmp, &dir)?;
    progress.step(&format!(
        "built Kubernetes {version} in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(dir)
}

fn major_minor(version: &str) -> anyhow::Result<(String, String)> {
    let mut parts = version.trim_start_matches('v').split('.');
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) => Ok((a.to_string(), b.to_string())),
        _ => bail!("cannot parse Kubernetes version {version}"),
    }
}

/// Whether a binary of `dir` exists (used by `status`).
pub fn has_binaries(dir: &Path) -> bool {
    BINARIES.iter().all(|b| dir.join(b).exists())
}

/// A program built from a Go module of this repository that pins it (`e2e/<dir>/go.mod`),
/// cached under `target/<cache>/<name>-<version>`.
#[derive(Debug, Clone, Copy)]
pub struct GoTool {
    /// The pinning module's directory, relative to the workspace root.
    pub dir: &'static str,
    /// The required module whose version names the build.
    pub module: &'static str,
    /// The package built.
    pub package: &'static str,
    /// Go build tags.
    pub tags: &'static [&'static str],
    /// Its name in messages and in the binary's file name.
    pub name: &'static str,
    /// Directory under `target/`.
    pub cache: &'static str,
}

/// The version `go_mod` requires of `module` (either `require` form).
pub fn required_version(go_mod: &str, module: &str) -> Option<String> {
    let prefix = format!("{module} ");
    go_mod.lines().find_map(|l| {
        let l = l.trim().strip_prefix("require ").unwrap_or(l.trim());
        l.strip_prefix(&prefix)
            .map(|v| v.split_whitespace().next().unwrap_or_default().to_string())
    })
}

impl GoTool {
    /// The pinned version, from its go.mod.
    pub fn version(&self, root: &Path) -> anyhow::Result<String> {
        let path = root.join(self.dir).join("go.mod");
        let go_mod = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        required_version(&go_mod, self.module)
            .with_context(|| format!("{}/go.mod does not require {}", self.dir, self.module))
    }

    /// Builds the program unless it is cached; returns the binary. `hint` follows the
    /// "building" line (e.g. how long the first build takes).
    pub fn ensure(
        &self,
        layout: &Layout,
        progress: &Progress,
        hint: &str,
    ) -> anyhow::Result<PathBuf> {
        let version = self.version(&layout.root)?;
        let out = layout
            .target
            .join(self.cache)
            .join(format!("{}-{version}", self.name));
        if out.is_file() {
            return Ok(out);
        }
        progress.step(&format!("building {} {version}{hint}…", self.name));
        go_build_tagged(
            &layout.root.join(self.dir),
            self.package,
            self.tags,
            &out,
            &format!("{} {version}", self.name),
        )?;
        progress.step(&format!("built {} {version}", self.name));
        Ok(out)
    }
}

/// Builds `package` of the Go module in `module` (its go.mod pins the version) into `out`,
/// statically and stripped, with Go build `tags` (e.g. Prometheus' `remove_all_sd`), at low
/// priority; `what` names it in the error. Written beside `out` and renamed, so an
/// interrupted build never looks cached.
pub fn go_build_tagged(
    module: &Path,
    package: &str,
    tags: &[&str],
    out: &Path,
    what: &str,
) -> anyhow::Result<()> {
    let go =
        go_binary().with_context(|| format!("Go is not installed (needed to build {what})"))?;
    std::fs::create_dir_all(out.parent().context("no parent")?)?;
    let partial = out.with_extension("partial");
    let output = std::process::Command::new("nice")
        .args(["-n", "10"])
        .arg(go)
        .args(["build", "-trimpath", "-ldflags=-s -w"])
        .arg(format!("-tags={}", tags.join(",")))
        .arg("-o")
        .arg(&partial)
        .arg(package)
        .current_dir(module)
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", "local")
        .stdin(std::process::Stdio::null())
        .output()
        .context("running go build")?;
    if !output.status.success() {
        anyhow::bail!(
            "building {what} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::rename(&partial, out)?;
    Ok(())
}
