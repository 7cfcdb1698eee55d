//! `cargo xtask images`: container images of kubevirt-rs built without Docker or a registry.
//!
//! virt-apiserver, virt-controller, virt-handler and etcd are FROM scratch: the binary plus
//! exactly the shared libraries `ldd` names (and the loader), taken from this Debian machine.
//! virt-launcher needs a userland (libvirtd with the QEMU driver, QEMU and its firmware,
//! qemu-img, xorriso, util-linux, a shell, busybox): its root filesystem is assembled from this
//! machine's files the same way — the programs, the `ldd` closure of every ELF file, and the
//! data directories QEMU and libvirt read — see [`launcher_rootfs`]; it also carries virt-importer,
//! the DataVolume worker, which runs its qemu-img. That avoids a base image we
//! would have to fetch and keeps the images small. Tags are a hash of the image's content, so an
//! unchanged input gives the same tag (no rebuild, no import, no rollout) and a changed one a new
//! tag. The test guest image (kernel, initramfs, disk) is `localhost/kubevirt-rs/test-guest:latest`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use crate::cluster::{self, ImageFile, ImageSpec};

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
    /// Also name every component image `localhost/kubevirt-rs/<component>:TAG` in the local
    /// cluster (they are always `:latest` too, the tag virt-operator deploys by default), e.g.
    /// to upgrade through a KubeVirt resource's spec.imageTag.
    #[arg(long)]
    pub tag: Option<String>,
}

/// Names of the images built (fully qualified, `localhost/…:<content hash>`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Built {
    pub apiserver: String,
    pub etcd: String,
    #[serde(default)]
    pub controller: String,
    #[serde(default)]
    pub handler: String,
    #[serde(default)]
    pub launcher: String,
    #[serde(default)]
    pub operator: String,
    /// Always [`TEST_GUEST_IMAGE`]; the archive is named after its content.
    #[serde(default)]
    pub test_guest: String,
    /// Archive of the test guest image (its name carries no hash).
    #[serde(default)]
    pub test_guest_archive: PathBuf,
}

impl Built {
    /// The component images (what virt-operator deploys, itself included), in a fixed order.
    pub fn components(&self) -> [&String; 6] {
        [
            &self.apiserver,
            &self.etcd,
            &self.controller,
            &self.handler,
            &self.launcher,
            &self.operator,
        ]
    }

    /// Every image with its archive.
    fn archives(&self) -> anyhow::Result<Vec<(String, PathBuf)>> {
        let mut out = Vec::new();
        for name in self.components() {
            if !name.is_empty() {
                out.push((name.clone(), archive_path(name)?));
            }
        }
        if !self.test_guest.is_empty() {
            out.push((self.test_guest.clone(), self.test_guest_archive.clone()));
        }
        Ok(out)
    }
}

const APISERVER_REPO: &str = "localhost/kubevirt-rs/virt-apiserver";
const CONTROLLER_REPO: &str = "localhost/kubevirt-rs/virt-controller";
const HANDLER_REPO: &str = "localhost/kubevirt-rs/virt-handler";
const LAUNCHER_REPO: &str = "localhost/kubevirt-rs/virt-launcher";
const ETCD_REPO: &str = "localhost/kubevirt-rs/etcd";
const OPERATOR_REPO: &str = "localhost/kubevirt-rs/virt-operator";
/// The launcher under the name virt-controller renders by default.
pub const LAUNCHER_LATEST: &str = "localhost/kubevirt-rs/virt-launcher:latest";
/// The test guest: `/vmlinuz`, `/initramfs.gz`, `/disk/disk.qcow2` (see `virt-testguest`).
pub const TEST_GUEST_IMAGE: &str = "localhost/kubevirt-rs/test-guest:latest";
/// Debian's etcd (package etcd-server); kube-apiserver 1.34 accepts it, so it is good enough for
/// our own storage too.
const ETCD_BINARY: &str = "/usr/bin/etcd";
/// iproute2's `ip`, in the virt-handler image.
const HANDLER_IP: &str = "/usr/sbin/ip";
/// nftables' `nft`, in the virt-handler image.
const HANDLER_NFT: &str = "/usr/sbin/nft";
const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What `build_binaries` builds, "PACKAGE BIN" per line: the images' binaries and
/// kubectl-virt. The e2e tests build their plugin with exactly this list (one cargo
/// invocation, one feature resolution), so neither build recompiles the dependencies the
/// other just built with other features (measured: minutes per e2e run).
const BUILD_SET: &str = include_str!("../../binaries.txt");

fn build_set() -> impl Iterator<Item = (&'static str, &'static str)> {
    BUILD_SET.lines().filter_map(|l| l.trim().split_once(' '))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let load = Load::from_flags(args.no_import, args.load_cmd);
    let built = ensure(load.clone())?;
    if let Some(tag) = &args.tag {
        tag_components(&built, tag, &load)?;
    }
    for (name, archive) in built.archives()? {
        println!("{name}\t{}", archive.display());
    }
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

/// Builds the binaries ([`Profile`]) and every image (cached by content), then loads them.
/// An exclusive lock on `dir`, held until the returned guard is dropped (also across
/// processes: flock on `dir/.lock`).
fn lock_dir(dir: &Path) -> anyhow::Result<nix::fcntl::Flock<fs::File>> {
    let path = dir.join(".lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking {}: {e}", path.display()))
}

pub fn ensure(load: Load) -> anyhow::Result<Built> {
    let dir = images_dir();
    fs::create_dir_all(&dir)?;
    // e2e binaries that run beside each other each deploy at their start, and all of them
    // stage into target/images/: one removed a stripped binary while another ran ldd on it
    // (access and guest failed so). One process builds, strips and imports at a time; the
    // next finds the images current.
    let _lock = lock_dir(&dir)?;
    let profile = Profile::from_env()?;
    build_binaries(profile)?;
    let stripped = |bin: &str| -> anyhow::Result<PathBuf> {
        // Stripped copy: the symbol table is most of a release binary and useless in a pod.
        let out = dir.join(bin);
        let _ = fs::remove_file(&out);
        exec(
            Command::new("strip")
                .arg("--strip-all")
                .arg("-o")
                .arg(&out)
                .arg(crate::target_dir().join(profile.dir()).join(bin)),
        )
        .with_context(|| format!("stripping {bin} (needs binutils)"))?;
        Ok(out)
    };
    let simple = |repo: &str, bin: &str| -> anyhow::Result<String> {
        let host = stripped(bin)?;
        let in_image = format!("/usr/bin/{bin}");
        image(repo, &host, &in_image, &[&in_image], &load)
    };
    let apiserver = simple(APISERVER_REPO, "virt-apiserver")?;
    let controller = simple(CONTROLLER_REPO, "virt-controller")?;
    // virt-handler builds the guests' bridges, taps and masquerade rules in the launcher
    // pods' network namespaces with iproute2 and nftables (virt-netsetup).
    let handler = image_with(
        HANDLER_REPO,
        &stripped("virt-handler")?,
        "/usr/bin/virt-handler",
        &["/usr/bin/virt-handler"],
        &[HANDLER_IP, HANDLER_NFT],
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
    let operator = simple(OPERATOR_REPO, "virt-operator")?;
    // virt-importer (node/importer) rides in the launcher image: it needs qemu-img and its
    // library closure, which that image carries already, and every node has the image.
    let launcher = launcher_image(
        &stripped("virt-launcher")?,
        &[
            stripped("virt-tail")?,
            stripped("virt-reaper")?,
            stripped("virt-importer")?,
        ],
        &load,
    )?;
    let (test_guest, test_guest_archive) = test_guest_image(&load)?;
    let built = Built {
        apiserver,
        etcd,
        controller,
        handler,
        launcher,
        operator,
        test_guest,
        test_guest_archive,
    };
    tag_components(&built, "latest", &load)?;
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

/// The Cargo profile the images' binaries are built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// What users run (`up`, `deploy`, the benchmarks): the default.
    Release,
    /// The debug build `cargo test --workspace` has already made. `cargo xtask test` deploys
    /// these for its e2e phase: the same sources with debug assertions and overflow checks
    /// on, without a second optimised build of every dependency (about 8 minutes on a clean
    /// 2-core machine, an eighth of CI's budget). Never for figures.
    Dev,
}

/// Environment variable choosing [`Profile`]: `release` (default) or `dev`.
pub const PROFILE_ENV: &str = "KUBEVIRT_RS_IMAGE_PROFILE";

impl Profile {
    pub fn from_env() -> anyhow::Result<Self> {
        match std::env::var(PROFILE_ENV).as_deref() {
            Err(_) | Ok("" | "release") => Ok(Profile::Release),
            Ok("dev") => Ok(Profile::Dev),
            Ok(other) => bail!("{PROFILE_ENV}={other}: expected `release` or `dev`"),
        }
    }

    /// The directory under target/ Cargo puts the binaries in.
    fn dir(self) -> &'static str {
        match self {
            Profile::Release => "release",
            Profile::Dev => "debug",
        }
    }
}

/// One `cargo build` for every binary of the images.
fn build_binaries(profile: Profile) -> anyhow::Result<()> {
    println!("building the binaries ({})…", profile.dir());
    let mut cmd = xtask::cargo();
    cmd.arg("build");
    if profile == Profile::Release {
        cmd.arg("--release");
    }
    for (package, bin) in build_set() {
        cmd.args(["-p", package, "--bin", bin]);
    }
    let status = cmd
        .current_dir(crate::workspace_root())
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!(
            "cargo build of the image binaries ({}) failed",
            profile.dir()
        );
    }
    Ok(())
}

/// The shared libraries (and loader) a dynamically linked ELF file needs, as paths in the host's
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

/// Builds (unless an archive with the same content exists) and loads one single-binary image.
fn image(
    repo: &str,
    binary: &Path,
    in_image: &str,
    entrypoint: &[&str],
    load: &Load,
) -> anyhow::Result<String> {
    image_with(repo, binary, in_image, entrypoint, &[], load)
}

/// [`image`] plus host `programs`, each at its host path with its shared libraries.
fn image_with(
    repo: &str,
    binary: &Path,
    in_image: &str,
    entrypoint: &[&str],
    programs: &[&str],
    load: &Load,
) -> anyhow::Result<String> {
    let mut files = vec![ImageFile {
        host: binary.to_path_buf(),
        image: in_image.to_string(),
    }];
    let mut elves = vec![binary.to_path_buf()];
    for p in programs {
        let host = Path::new(p);
        if !host.is_file() {
            bail!("{p} missing (cargo xtask deps installs it)");
        }
        files.push(ImageFile {
            host: host.canonicalize()?,
            image: p.to_string(),
        });
        elves.push(host.to_path_buf());
    }
    for elf in &elves {
        for lib in shared_libraries(elf)? {
            let image_path = lib.to_string_lossy().into_owned();
            if files.iter().any(|f| f.image == image_path) {
                continue;
            }
            // buildah copies a symlink as a link; the image needs the file under the linked name.
            let real = lib
                .canonicalize()
                .with_context(|| format!("resolving {}", lib.display()))?;
            files.push(ImageFile {
                host: real,
                image: image_path,
            });
        }
    }
    let mut hash = Sha256::new();
    for f in &files {
        hash.update(f.image.as_bytes());
        hash.update(fs::read(&f.host).with_context(|| format!("reading {}", f.host.display()))?);
    }
    hash.update(serde_json::to_vec(entrypoint)?);
    let tag = &hex::encode(hash.finalize())[..12];
    let name = format!("{repo}:{tag}");
    let archive = archive_path(&name)?;
    build_once(&name, &archive, |partial| {
        cluster::build_scratch_image(&name, &files, entrypoint, partial)
    })?;
    load_archive(&name, &archive, load)?;
    Ok(name)
}

/// Runs `build` into a partial file unless `archive` exists, then renames it and removes older
/// archives of the same image.
fn build_once(
    name: &str,
    archive: &Path,
    build: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if !archive.exists() {
        println!("building {name}…");
        let t = std::time::Instant::now();
        let partial = archive.with_extension("partial");
        build(&partial)?;
        fs::rename(&partial, archive)?;
        println!("built {name} in {:.1} s", t.elapsed().as_secs_f64());
        let file_name = archive
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Older archives of this image are superseded: `<short>-<hash>.oci.tar`.
        if let Some((short, _)) = file_name.rsplit_once('-') {
            for e in fs::read_dir(images_dir())?.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                let other_hash = n
                    .strip_prefix(&format!("{short}-"))
                    .and_then(|r| r.strip_suffix(".oci.tar"));
                if other_hash.is_some_and(|h| !h.contains('-')) && e.path() != archive {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
    println!(
        "{name}: {} (archive {:.1} MB)",
        archive.display(),
        fs::metadata(archive)?.len() as f64 / 1e6
    );
    Ok(())
}

fn archive_path(name: &str) -> anyhow::Result<PathBuf> {
    let (repo, tag) = name.rsplit_once(':').context("image name without tag")?;
    let short = repo.rsplit('/').next().unwrap_or("image");
    Ok(images_dir().join(format!("{short}-{tag}.oci.tar")))
}

/// Loads the images of an earlier build (`deploy --no-build`; the local cluster may have been
/// recreated since).
pub fn load_built(built: &Built, load: &Load) -> anyhow::Result<()> {
    for (name, archive) in built.archives()? {
        if !archive.exists() {
            bail!("{} missing: run `cargo xtask images`", archive.display());
        }
        load_archive(&name, &archive, load)?;
        if name == built.launcher {
            tag_latest(&name, LAUNCHER_LATEST, load)?;
        }
    }
    tag_components(built, "latest", load)
}

/// Names every component image (operator included) `<repo>:<tag>` in the local cluster: the
/// names virt-operator deploys (`<registry>/<component>:<imageTag>`).
pub fn tag_components(built: &Built, tag: &str, load: &Load) -> anyhow::Result<()> {
    for name in built.components() {
        if let Some((repo, _)) = name.rsplit_once(':') {
            tag_latest(name, &format!("{repo}:{tag}"), load)?;
        }
    }
    Ok(())
}

fn load_archive(name: &str, archive: &Path, load: &Load) -> anyhow::Result<()> {
    match load {
        Load::None => {}
        Load::Local => {
            // A name that carries no content hash (`:latest`) is current only with the same
            // manifest digest.
            let current = match archive_digest(archive) {
                Some(digest) => every_node_digest(name).as_deref() == Some(&*digest),
                None => every_node_digest(name).is_some(),
            };
            if current {
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

/// Gives the image a second name in the local cluster (e.g. the launcher as `:latest`, the name
/// virt-controller renders unless told otherwise).
fn tag_latest(name: &str, latest: &str, load: &Load) -> anyhow::Result<()> {
    if matches!(load, Load::Local)
        && local_socket().exists()
        && local_cluster_digest(latest) != local_cluster_digest(name)
    {
        cluster::tag_image(name, latest)?;
    }
    Ok(())
}

fn local_socket() -> PathBuf {
    crate::target_dir().join("cluster/state/run/containerd.sock")
}

/// The manifest digest of `name` when every node of the local cluster (the second node's
/// containerd too, when its socket is there) has it with the same digest. A node may lack an
/// image the first has: its kubelet deletes unused images under disk pressure, and a pod
/// scheduled there then fails to pull (no registry) until the image is imported again.
fn every_node_digest(name: &str) -> Option<String> {
    let second = local_socket().with_file_name("containerd-2.sock");
    let first = local_cluster_digest(name)?;
    if second.exists() && socket_digest(&second, name).as_deref() != Some(&*first) {
        return None;
    }
    Some(first)
}

/// The manifest digest of `name` in the local cluster's (first node's) containerd, if it has
/// the image.
fn local_cluster_digest(name: &str) -> Option<String> {
    let socket = local_socket();
    if !socket.exists() {
        return None;
    }
    socket_digest(&socket, name)
}

/// The manifest digest of `name` in the containerd at `socket`.
fn socket_digest(socket: &Path, name: &str) -> Option<String> {
    let out = Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io", "images", "ls"])
        .output()
        .ok()?;
    // REF TYPE DIGEST SIZE PLATFORMS LABELS
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut cols = l.split_whitespace();
        (cols.next() == Some(name))
            .then(|| cols.nth(1).map(str::to_string))
            .flatten()
    })
}

/// The digest of the (only) manifest in an OCI archive.
fn archive_digest(archive: &Path) -> Option<String> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg("index.json")
        .output()
        .ok()?;
    let index: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    index["manifests"][0]["digest"].as_str().map(str::to_string)
}

/// The test guest as an image: FROM scratch with `/vmlinuz`, `/initramfs.gz`,
/// `/disk/disk.qcow2`, named `:latest` (VM specs name it so); the archive is named after its
/// content hash. Builds target/guest first when needed (`cargo xtask guest`).
fn test_guest_image(load: &Load) -> anyhow::Result<(String, PathBuf)> {
    let guest = virt_testguest::ensure(&virt_testguest::default_dir())
        .context("building the test guest (cargo xtask guest)")?;
    let files = vec![
        ImageFile {
            host: guest.kernel.clone(),
            image: "/vmlinuz".into(),
        },
        ImageFile {
            host: guest.initrd.clone(),
            image: "/initramfs.gz".into(),
        },
        ImageFile {
            host: guest.disk.clone(),
            image: "/disk/disk.qcow2".into(),
        },
    ];
    let mut hash = Sha256::new();
    for f in &files {
        hash.update(f.image.as_bytes());
        hash.update(fs::read(&f.host).with_context(|| format!("reading {}", f.host.display()))?);
    }
    let tag = &hex::encode(hash.finalize())[..12];
    let archive = images_dir().join(format!("test-guest-{tag}.oci.tar"));
    build_once(TEST_GUEST_IMAGE, &archive, |partial| {
        // No entrypoint is ever run: init containers copy the files out with the launcher
        // image's busybox.
        cluster::build_scratch_image(TEST_GUEST_IMAGE, &files, &["/vmlinuz"], partial)
    })?;
    load_archive(TEST_GUEST_IMAGE, &archive, load)?;
    Ok((TEST_GUEST_IMAGE.to_string(), archive))
}

/// The Debian 12 test guest as a containerDisk image.
pub const DEBIAN_GUEST_IMAGE: &str = "localhost/kubevirt-rs/debian-guest:latest";

/// The Debian 12 test guest (virt-testguest's `debian`) as a containerDisk image in
/// KubeVirt's layout: FROM scratch with only `/disk/disk.qcow2`, owned by 107:107, mode 0440.
/// Its files come from a tar archive, not `buildah copy`, which would make them root's.
/// Named `:latest`; the archive is named after its content hash. Builds
/// target/guest-debian first when needed (root, minutes: `cargo xtask guest --debian`).
pub fn debian_guest_image(load: &Load) -> anyhow::Result<(String, PathBuf)> {
    use virt_testguest::debian;
    let guest = debian::ensure(&debian::default_dir())
        .context("building the Debian test guest (cargo xtask guest --debian)")?;
    let mut hash = Sha256::new();
    for f in debian::container_disk_files(&guest) {
        hash.update(f.image.as_bytes());
        hash.update(format!("{}:{}:{:o}", f.uid, f.gid, f.mode));
        hash.update(fs::read(&f.host).with_context(|| format!("reading {}", f.host.display()))?);
    }
    let tag = &hex::encode(hash.finalize())[..12];
    let archive = images_dir().join(format!("debian-guest-{tag}.oci.tar"));
    build_once(DEBIAN_GUEST_IMAGE, &archive, |partial| {
        let tar = images_dir().join("debian-guest-rootfs.tar");
        debian::container_disk_tar(&guest, &tar)?;
        let built = cluster::build_image(
            DEBIAN_GUEST_IMAGE,
            &ImageSpec {
                rootfs_tar: Some(&tar),
                ..ImageSpec::default()
            },
            partial,
        );
        let _ = fs::remove_file(&tar);
        built
    })?;
    load_archive(DEBIAN_GUEST_IMAGE, &archive, load)?;
    Ok((DEBIAN_GUEST_IMAGE.to_string(), archive))
}

/// Programs of the launcher image, with the `ldd` closure of each.
const LAUNCHER_PROGRAMS: &[&str] = &[
    "/usr/sbin/libvirtd",
    "/usr/bin/qemu-system-x86_64",
    "/usr/bin/qemu-img",
    // Cancels a migration (virDomainAbortJob; the launcher has no binding of its own).
    "/usr/bin/virsh",
    "/usr/bin/xorriso",
    "/usr/bin/unshare",
    "/usr/bin/setpriv",
    "/usr/bin/mount",
    "/usr/bin/umount",
    "/usr/bin/dash",
    // libvirtd reads the host's SMBIOS with it at start.
    "/usr/sbin/dmidecode",
    // The private daemon's namespace script (mkdir), and enough to look around with
    // `kubectl exec`.
    "/usr/bin/mkdir",
    "/usr/bin/rm",
    "/usr/bin/cp",
    "/usr/bin/mv",
    "/usr/bin/ln",
    "/usr/bin/cat",
    "/usr/bin/ls",
    "/usr/bin/chmod",
    "/usr/bin/touch",
    "/usr/bin/sleep",
];
/// Only the QEMU driver is ever loaded (`LIBVIRT_DRIVER_DIR`, node/launcher/src/daemon.rs).
const LIBVIRT_QEMU_DRIVER: &str =
    "/usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so";
/// QEMU modules: TCG is one (no emulation without it), and the plain virtio GPUs.
const QEMU_MODULES: &[&str] = &[
    "accel-tcg-x86_64.so",
    "accel-tcg-i386.so",
    "hw-display-virtio-gpu.so",
    "hw-display-virtio-gpu-pci.so",
    "hw-display-virtio-vga.so",
];
const QEMU_MODULE_DIR: &str = "/usr/lib/x86_64-linux-gnu/qemu";
/// Data QEMU and libvirt read: firmware and option ROMs (SeaBIOS, iPXE, linuxboot, VGA BIOS),
/// OVMF for `efi` VMs (Debian's `ovmf`: its builds in /usr/share/OVMF, and the descriptors in
/// /usr/share/qemu/firmware libvirt selects one by), keymaps, libvirt's CPU map. Copied as
/// trees, symlinks kept.
const LAUNCHER_DATA: &[&str] = &[
    "/usr/share/qemu",
    "/usr/share/seabios",
    "/usr/share/OVMF",
    "/usr/lib/ipxe/qemu",
    "/usr/share/libvirt/cpu_map",
];
/// busybox-static, copied into the pod by its `virt-bin` init container (docs/cluster-flow.md).
const BUSYBOX: &str = "/bin/busybox";

/// One entry of an image's root filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Dir(u32),
    /// Host file (followed if a link) and the mode in the image.
    File(PathBuf, u32),
    Bytes(Vec<u8>, u32),
    Link(PathBuf),
}

/// A root filesystem assembled from host files, in the usr-merged layout (`/bin`, `/sbin`,
/// `/lib`, `/lib64` are links into `/usr`).
#[derive(Debug, Default)]
struct Rootfs(BTreeMap<PathBuf, Entry>);

/// `/lib/x` → `/usr/lib/x` etc.: where a host path lives in a usr-merged tree.
fn usr_merged(p: &Path) -> PathBuf {
    let mut comps = p.components();
    match (comps.next(), comps.next()) {
        (Some(Component::RootDir), Some(Component::Normal(first)))
            if ["bin", "sbin", "lib", "lib64"].contains(&&*first.to_string_lossy()) =>
        {
            Path::new("/usr").join(first).join(comps.as_path())
        }
        _ => p.to_path_buf(),
    }
}

impl Rootfs {
    fn dir(&mut self, p: &Path, mode: u32) {
        for a in p.ancestors() {
            if a == Path::new("/") {
                break;
            }
            self.0.entry(a.to_path_buf()).or_insert(Entry::Dir(0o755));
        }
        self.0.insert(p.to_path_buf(), Entry::Dir(mode));
    }

    fn put(&mut self, p: &Path, e: Entry) {
        if let Some(parent) = p.parent() {
            for a in parent.ancestors() {
                if a == Path::new("/") {
                    break;
                }
                self.0.entry(a.to_path_buf()).or_insert(Entry::Dir(0o755));
            }
        }
        self.0.insert(p.to_path_buf(), e);
    }

    /// A host file at its (usr-merged) path, following links.
    fn file(&mut self, host: &Path) -> anyhow::Result<()> {
        let real = host
            .canonicalize()
            .with_context(|| format!("{} missing", host.display()))?;
        let mode = fs::metadata(&real)?.permissions().mode() & 0o7777;
        self.put(&usr_merged(host), Entry::File(real, mode));
        Ok(())
    }

    /// A program or shared object plus every library it loads.
    fn elf(&mut self, host: &Path) -> anyhow::Result<()> {
        self.file(host)?;
        for lib in shared_libraries(host)? {
            self.file(&lib)?;
        }
        Ok(())
    }

    /// A host directory tree, links kept as links.
    fn tree(&mut self, host: &Path) -> anyhow::Result<()> {
        let meta = fs::symlink_metadata(host).with_context(|| format!("{}", host.display()))?;
        let at = usr_merged(host);
        if meta.file_type().is_symlink() {
            self.put(&at, Entry::Link(fs::read_link(host)?));
        } else if meta.is_dir() {
            self.dir(&at, meta.permissions().mode() & 0o7777);
            for e in fs::read_dir(host)? {
                self.tree(&e?.path())?;
            }
        } else {
            self.put(
                &at,
                Entry::File(host.to_path_buf(), meta.permissions().mode() & 0o7777),
            );
        }
        Ok(())
    }

    /// Content hash of the whole tree (paths, modes, link targets, file contents).
    fn hash(&self) -> anyhow::Result<String> {
        let mut h = Sha256::new();
        for (p, e) in &self.0 {
            h.update(p.as_os_str().as_encoded_bytes());
            h.update([0]);
            match e {
                Entry::Dir(m) => h.update(format!("d{m:o}")),
                Entry::File(src, m) => {
                    h.update(format!("f{m:o}"));
                    h.update(fs::read(src).with_context(|| format!("reading {}", src.display()))?);
                }
                Entry::Bytes(b, m) => {
                    h.update(format!("b{m:o}"));
                    h.update(b);
                }
                Entry::Link(t) => {
                    h.update("l");
                    h.update(t.as_os_str().as_encoded_bytes());
                }
            }
            h.update([0]);
        }
        Ok(hex::encode(h.finalize()))
    }

    /// Writes the tree below `dir`, then a tar of it to `tar` (numeric root ownership).
    fn write_tar(&self, dir: &Path, tar: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::symlink;
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir)?;
        let inside = |p: &Path| dir.join(p.strip_prefix("/").unwrap_or(p));
        for (p, e) in &self.0 {
            let at = inside(p);
            match e {
                Entry::Dir(_) => fs::create_dir_all(&at)?,
                Entry::File(src, _) => {
                    fs::copy(src, &at).with_context(|| format!("copying {}", src.display()))?;
                }
                Entry::Bytes(b, _) => fs::write(&at, b)?,
                Entry::Link(t) => symlink(t, &at)?,
            }
        }
        // Modes last: a read-only directory would refuse its own entries.
        for (p, e) in &self.0 {
            if let Entry::Dir(m) | Entry::File(_, m) | Entry::Bytes(_, m) = e {
                fs::set_permissions(inside(p), fs::Permissions::from_mode(*m))?;
            }
        }
        exec(
            Command::new("tar")
                .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
                .arg(dir)
                .arg("-cf")
                .arg(tar)
                .arg("."),
        )?;
        Ok(())
    }
}

/// The launcher's root filesystem: everything `virt-launcher` runs (node/launcher: a private
/// libvirtd in its own namespaces via setpriv/unshare/mount and a shell, QEMU, qemu-img for
/// overlays, xorriso for cloud-init ISOs) and busybox for the pod's init containers.
/// `helpers`: the launcher package's other binaries (virt-tail, virt-reaper) and the
/// DataVolume worker virt-importer (which runs qemu-img), installed beside it in /usr/bin
/// under their file names.
fn launcher_rootfs(launcher: &Path, helpers: &[PathBuf]) -> anyhow::Result<Rootfs> {
    let mut fs_ = Rootfs::default();
    for d in ["bin", "sbin", "lib", "lib64"] {
        fs_.put(
            &Path::new("/").join(d),
            Entry::Link(format!("usr/{d}").into()),
        );
    }
    for d in [
        "/dev",
        "/proc",
        "/sys",
        "/run",
        "/etc/libvirt",
        "/var/lib",
        "/var/cache",
        "/var/log",
        "/root",
    ] {
        fs_.dir(Path::new(d), 0o755);
    }
    fs_.dir(Path::new("/tmp"), 0o1777);
    fs_.put(Path::new("/var/run"), Entry::Link("../run".into()));
    // libvirt resolves `user = "root"` of qemu.conf, and before reading it its built-in
    // default (Debian's `libvirt-qemu`, group `kvm`): both must exist. Debian's ids. In a
    // pod the launcher runs as uid 107 (`qemu`, KubeVirt's), and libvirt's session mode
    // refuses a user without a record.
    fs_.put(
        Path::new("/etc/passwd"),
        Entry::Bytes(
            b"root:x:0:0:root:/root:/bin/sh\n\
              libvirt-qemu:x:64055:107:Libvirt Qemu:/var/lib/libvirt:/usr/sbin/nologin\n\
              qemu:x:107:107:virt-launcher:/var/run/kubevirt-rs/work:/usr/sbin/nologin\n"
                .to_vec(),
            0o644,
        ),
    );
    fs_.put(
        Path::new("/etc/group"),
        Entry::Bytes(
            b"root:x:0:\nkvm:x:107:\nlibvirt:x:112:\nlibvirt-qemu:x:64055:libvirt-qemu\n".to_vec(),
            0o644,
        ),
    );
    fs_.put(
        Path::new("/usr/bin/virt-launcher"),
        Entry::File(launcher.to_path_buf(), 0o755),
    );
    for lib in shared_libraries(launcher)? {
        fs_.file(&lib)?;
    }
    for h in helpers {
        let name = h
            .file_name()
            .context("a helper binary without a file name")?;
        fs_.put(
            &Path::new("/usr/bin").join(name),
            Entry::File(h.clone(), 0o755),
        );
        // Their libraries are a subset of the launcher's (libc): added for certainty.
        for lib in shared_libraries(h)? {
            fs_.file(&lib)?;
        }
    }
    for p in LAUNCHER_PROGRAMS {
        fs_.elf(Path::new(p))?;
    }
    fs_.put(Path::new("/usr/bin/sh"), Entry::Link("dash".into()));
    fs_.elf(Path::new(LIBVIRT_QEMU_DRIVER))?;
    for m in QEMU_MODULES {
        fs_.elf(&Path::new(QEMU_MODULE_DIR).join(m))?;
    }
    for d in LAUNCHER_DATA {
        fs_.tree(Path::new(d))?;
    }
    if !Path::new(BUSYBOX).exists() {
        bail!("{BUSYBOX} missing (apt-get install busybox-static)");
    }
    fs_.file(Path::new(BUSYBOX))?;
    Ok(fs_)
}

fn launcher_image(launcher: &Path, helpers: &[PathBuf], load: &Load) -> anyhow::Result<String> {
    let rootfs = launcher_rootfs(launcher, helpers)?;
    let entrypoint = ["/usr/bin/virt-launcher"];
    let mut h = Sha256::new();
    h.update(rootfs.hash()?);
    h.update(serde_json::to_vec(&entrypoint)?);
    h.update(PATH_ENV);
    let tag = &hex::encode(h.finalize())[..12];
    let name = format!("{LAUNCHER_REPO}:{tag}");
    let archive = archive_path(&name)?;
    build_once(&name, &archive, |partial| {
        let staging = images_dir().join("virt-launcher-rootfs");
        let tar = images_dir().join("virt-launcher-rootfs.tar");
        rootfs.write_tar(&staging, &tar)?;
        let built = cluster::build_image(
            &name,
            &ImageSpec {
                rootfs_tar: Some(&tar),
                entrypoint: &entrypoint,
                env: &[PATH_ENV],
                ..ImageSpec::default()
            },
            partial,
        );
        let _ = fs::remove_dir_all(&staging);
        let _ = fs::remove_file(&tar);
        built
    })?;
    load_archive(&name, &archive, load)?;
    tag_latest(&name, LAUNCHER_LATEST, load)?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usr_merge_maps_top_level_dirs() {
        assert_eq!(
            usr_merged(Path::new("/lib64/ld-linux-x86-64.so.2")),
            Path::new("/usr/lib64/ld-linux-x86-64.so.2")
        );
        assert_eq!(
            usr_merged(Path::new("/bin/busybox")),
            Path::new("/usr/bin/busybox")
        );
        assert_eq!(
            usr_merged(Path::new("/usr/share/qemu")),
            Path::new("/usr/share/qemu")
        );
        assert_eq!(usr_merged(Path::new("/library/x")), Path::new("/library/x"));
    }
}
