//! `cargo xtask images`: container images of kubevirt-rs built without Docker or a registry.
//!
//! Each image is FROM scratch: the binary plus exactly the shared libraries `ldd` names (and the
//! loader), taken from this Debian machine. That avoids a base image we would have to fetch and
//! keeps the images small. Tags are a hash of the image's content, so an unchanged binary gives
//! the same tag (no rollout on a second `deploy`) and a changed one a new tag (a rollout).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use crate::cluster::{self, ImageFile};

/// Arguments of `cargo xtask images`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only build the archives (target/images/*.oci.tar); do not import them into the local cluster.
    #[arg(long)]
    pub no_import: bool,
    /// Command that loads an OCI archive into another cluster (the archive path is appended),
    /// e.g. `kind load image-archive --name kubevirt-rs`.
    #[arg(long)]
    pub load_cmd: Option<String>,
}

/// Names of the images built (fully qualified, `localhost/…:<content hash>`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Built {
    pub apiserver: String,
    pub etcd: String,
}

const APISERVER_REPO: &str = "localhost/kubevirt-rs/virt-apiserver";
const ETCD_REPO: &str = "localhost/kubevirt-rs/etcd";
/// Debian's etcd (package etcd-server); kube-apiserver 1.34 accepts it, so it is good enough for
/// our own storage too.
const ETCD_BINARY: &str = "/usr/bin/etcd";

pub fn run(args: Args) -> anyhow::Result<()> {
    let built = ensure(Load::from_flags(args.no_import, args.load_cmd))?;
    println!("{}\n{}", built.apiserver, built.etcd);
    Ok(())
}

/// Where the built images go.
#[derive(Debug, Clone)]
pub enum Load {
    /// Nowhere: archives only.
    None,
    /// Into the local cluster's containerd, when it runs.
    Local,
    /// With this command (archive appended).
    Command(String),
}

impl Load {
    pub fn from_flags(no_import: bool, load_cmd: Option<String>) -> Self {
        match (no_import, load_cmd) {
            (true, _) => Load::None,
            (false, Some(c)) => Load::Command(c),
            (false, None) => Load::Local,
        }
    }
}

fn images_dir() -> PathBuf {
    crate::target_dir().join("images")
}

/// The record of the last build, for `deploy` when it is told not to build.
pub fn record_path() -> PathBuf {
    images_dir().join("images.json")
}

/// Builds the release binary and both images (cached by content), then loads them.
pub fn ensure(load: Load) -> anyhow::Result<Built> {
    let dir = images_dir();
    fs::create_dir_all(&dir)?;
    let binary = build_apiserver()?;
    // Stripped copy: the symbol table is most of the release binary and useless in a pod.
    let stripped = dir.join("virt-apiserver");
    let _ = fs::remove_file(&stripped);
    exec(
        Command::new("strip")
            .arg("--strip-all")
            .arg("-o")
            .arg(&stripped)
            .arg(&binary),
    )
    .context("stripping virt-apiserver (needs binutils)")?;

    let apiserver = image(
        APISERVER_REPO,
        &stripped,
        "/usr/bin/virt-apiserver",
        &["/usr/bin/virt-apiserver"],
        &load,
    )?;
    if !Path::new(ETCD_BINARY).exists() {
        bail!("{ETCD_BINARY} missing (apt-get install etcd-server)");
    }
    let etcd = image(
        ETCD_REPO,
        Path::new(ETCD_BINARY),
        "/usr/bin/etcd",
        &["/usr/bin/etcd"],
        &load,
    )?;
    let built = Built { apiserver, etcd };
    fs::write(record_path(), serde_json::to_string_pretty(&built)?)?;
    Ok(built)
}

fn exec(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn build_apiserver() -> anyhow::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    println!("building virt-apiserver (release)…");
    // nice: the machine's cores are shared with other builds.
    let status = Command::new("nice")
        .args(["-n", "10"])
        .arg(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "virt-apiserver",
            "--bin",
            "virt-apiserver",
        ])
        .current_dir(crate::workspace_root())
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build --release -p virt-apiserver failed");
    }
    Ok(crate::target_dir().join("release/virt-apiserver"))
}

/// The shared libraries (and loader) a dynamically linked binary needs, as paths in the host's
/// filesystem: the paths the loader will look for inside the image, too.
fn shared_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = exec(Command::new("ldd").arg(binary))?;
    if out.contains("not a dynamic executable") || out.contains("statically linked") {
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in out.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)";
        // linux-vdso has no file.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        } else if line.contains("not found") {
            bail!("{}: {line}", binary.display());
        }
    }
    Ok(libs)
}

/// Builds (unless an archive with the same content exists) and loads one image.
fn image(
    repo: &str,
    binary: &Path,
    in_image: &str,
    entrypoint: &[&str],
    load: &Load,
) -> anyhow::Result<String> {
    let mut files = vec![ImageFile {
        host: binary.to_path_buf(),
        image: in_image.to_string(),
    }];
    for lib in shared_libraries(binary)? {
        // buildah copies a symlink as a link; the image needs the file under the linked name.
        let real = lib
            .canonicalize()
            .with_context(|| format!("resolving {}", lib.display()))?;
        files.push(ImageFile {
            host: real,
            image: lib.to_string_lossy().into_owned(),
        });
    }
    let mut hash = Sha256::new();
    for f in &files {
        hash.update(f.image.as_bytes());
        hash.update(fs::read(&f.host).with_context(|| format!("reading {}", f.host.display()))?);
    }
    hash.update(serde_json::to_vec(entrypoint)?);
    let tag = &hex::encode(hash.finalize())[..12];
    let name = format!("{repo}:{tag}");
    let short = repo.rsplit('/').next().unwrap_or("image");
    let archive = images_dir().join(format!("{short}-{tag}.oci.tar"));
    if !archive.exists() {
        println!("building {name}…");
        let partial = archive.with_extension("partial");
        cluster::build_scratch_image(&name, &files, entrypoint, &partial)?;
        fs::rename(&partial, &archive)?;
        // Older archives of this image are superseded.
        for e in fs::read_dir(images_dir())?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(&format!("{short}-")) && n.ends_with(".oci.tar") && e.path() != archive
            {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    println!(
        "{name}: {} (archive {:.1} MB)",
        archive.display(),
        fs::metadata(&archive)?.len() as f64 / 1e6
    );
    load_archive(&name, &archive, load)?;
    Ok(name)
}

fn archive_path(name: &str) -> anyhow::Result<PathBuf> {
    let (repo, tag) = name.rsplit_once(':').context("image name without tag")?;
    let short = repo.rsplit('/').next().unwrap_or("image");
    Ok(images_dir().join(format!("{short}-{tag}.oci.tar")))
}

/// Loads the images of an earlier build (`deploy --no-build`; the local cluster may have been
/// recreated since).
pub fn load_built(built: &Built, load: &Load) -> anyhow::Result<()> {
    for name in [&built.apiserver, &built.etcd] {
        let archive = archive_path(name)?;
        if !archive.exists() {
            bail!("{} missing: run `cargo xtask images`", archive.display());
        }
        load_archive(name, &archive, load)?;
    }
    Ok(())
}

fn load_archive(name: &str, archive: &Path, load: &Load) -> anyhow::Result<()> {
    match load {
        Load::None => {}
        Load::Local => {
            if local_cluster_has(name) {
                println!("{name}: already in the local cluster");
            } else if local_socket().exists() {
                cluster::import_image(archive)?;
                println!("{name}: imported into the local cluster");
            } else {
                println!("{name}: local cluster not running, not imported");
            }
        }
        Load::Command(cmd) => {
            let mut parts = cmd.split_whitespace();
            let program = parts.next().context("--load-cmd is empty")?;
            let status = Command::new(program).args(parts).arg(archive).status()?;
            if !status.success() {
                bail!("{cmd} {} failed", archive.display());
            }
        }
    }
    Ok(())
}

fn local_socket() -> PathBuf {
    crate::target_dir().join("cluster/state/run/containerd.sock")
}

/// Whether the local cluster's containerd already has the image (import takes seconds; a second
/// `up` should not).
fn local_cluster_has(name: &str) -> bool {
    let socket = local_socket();
    socket.exists()
        && Command::new("ctr")
            .arg("--address")
            .arg(&socket)
            .args(["--namespace", "k8s.io", "images", "ls", "--quiet"])
            .output()
            .is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l == name)
            })
}
