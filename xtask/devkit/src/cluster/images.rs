//! Images without a registry: built FROM scratch with buildah (vfs storage, no daemon), written
//! as OCI archives and imported into the cluster's containerd.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use super::Layout;

/// The sandbox image containerd uses for every pod; fully qualified, since a bare name would be
/// normalised to docker.io and containerd would try to pull it.
pub const PAUSE_IMAGE: &str = "localhost/kubevirt-rs/pause:1";

fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed: {}",
            cmd,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A file to put into an image: host path and path inside the image.
#[derive(Debug, Clone)]
pub struct ImageFile {
    pub host: PathBuf,
    pub image: String,
}

/// Builds an image FROM scratch holding `files`, with `entrypoint`, and writes it as an OCI
/// archive to `archive`. `name` must be fully qualified (`localhost/…:tag`).
pub fn build_scratch_image(
    layout: &Layout,
    name: &str,
    files: &[ImageFile],
    entrypoint: &[&str],
    archive: &Path,
) -> anyhow::Result<()> {
    build_image(
        layout,
        name,
        &ImageSpec {
            files,
            entrypoint,
            ..ImageSpec::default()
        },
        archive,
    )
}

/// What goes into a FROM-scratch image.
#[derive(Debug, Default, Clone, Copy)]
pub struct ImageSpec<'a> {
    /// A tar archive unpacked at `/` first (a whole root filesystem: symlinks, modes kept).
    pub rootfs_tar: Option<&'a Path>,
    /// Single files copied in afterwards.
    pub files: &'a [ImageFile],
    pub entrypoint: &'a [&'a str],
    /// `KEY=VALUE` environment of the image.
    pub env: &'a [&'a str],
}

/// Builds an image FROM scratch as `spec` says and writes it as an OCI archive to `archive`.
/// `name` must be fully qualified (`localhost/…:tag`).
pub fn build_image(
    layout: &Layout,
    name: &str,
    spec: &ImageSpec<'_>,
    archive: &Path,
) -> anyhow::Result<()> {
    // A throw-away buildah store per build: nothing to clean up in the host's default store and
    // no interference with other people's buildah use.
    let store = layout.cache.join(format!("buildah-{}", std::process::id()));
    let _ = fs::remove_dir_all(&store);
    fs::create_dir_all(&store)?;
    let result = (|| -> anyhow::Result<()> {
        let buildah = || {
            let mut c = Command::new("buildah");
            c.arg("--storage-driver")
                .arg("vfs")
                .arg("--root")
                .arg(store.join("root"))
                .arg("--runroot")
                .arg(store.join("run"));
            c
        };
        let ctr = run(buildah().args(["from", "scratch"]))?;
        if let Some(tar) = spec.rootfs_tar {
            // `add` unpacks a local tar archive at the destination.
            run(buildah().arg("add").arg(&ctr).arg(tar).arg("/"))?;
        }
        for f in spec.files {
            run(buildah().arg("copy").arg(&ctr).arg(&f.host).arg(&f.image))?;
        }
        let ep = serde_json::to_string(spec.entrypoint)?;
        let mut config = buildah();
        config.args(["config", "--entrypoint", &ep]);
        for e in spec.env {
            config.args(["--env", e]);
        }
        run(config.arg(&ctr))?;
        run(buildah().args(["commit", "--quiet", &ctr, name]))?;
        if let Some(parent) = archive.parent() {
            fs::create_dir_all(parent)?;
        }
        let _ = fs::remove_file(archive);
        run(buildah()
            .arg("push")
            .arg("--quiet")
            .arg(name)
            .arg(format!("oci-archive:{}:{name}", archive.display())))?;
        Ok(())
    })();
    let _ = fs::remove_dir_all(&store);
    result
}

/// Builds the pause image archive unless a current one is cached. Returns its path.
pub fn pause_archive(layout: &Layout) -> anyhow::Result<PathBuf> {
    let source = layout.root.join("e2e/pause/pause.c");
    let archive = layout.cache.join("pause.oci.tar");
    let newer = |a: &Path, b: &Path| -> bool {
        match (
            fs::metadata(a).and_then(|m| m.modified()),
            fs::metadata(b).and_then(|m| m.modified()),
        ) {
            (Ok(a), Ok(b)) => a >= b,
            _ => false,
        }
    };
    if newer(&archive, &source) {
        return Ok(archive);
    }
    fs::create_dir_all(&layout.cache)?;
    let binary = layout.cache.join("pause");
    run(Command::new("gcc")
        .args(["-static", "-O2", "-Wall", "-o"])
        .arg(&binary)
        .arg(&source))
    .context("compiling e2e/pause/pause.c (needs gcc and libc6-dev)")?;
    build_scratch_image(
        layout,
        PAUSE_IMAGE,
        &[ImageFile {
            host: binary,
            image: "/pause".into(),
        }],
        &["/pause"],
        &archive,
    )?;
    Ok(archive)
}

/// Imports an OCI archive into every node's containerd (CRI namespace `k8s.io`), after
/// putting back any of the cluster's own images a node lost.
pub fn import_all(layout: &Layout, archive: &Path) -> anyhow::Result<()> {
    let mut nodes = vec![layout.clone()];
    if super::node2::running(layout) {
        nodes.push(super::node2::node_layout(layout));
    }
    for node in &nodes {
        restore_base_images(layout, node)?;
        import(node, archive)?;
    }
    Ok(())
}

/// The cluster's own images, by name and cached archive, that every node must keep.
fn base_images(layout: &Layout) -> [(&'static str, PathBuf); 2] {
    [
        (PAUSE_IMAGE, layout.cache.join("pause.oci.tar")),
        (
            super::storage::HELPER_IMAGE,
            layout.cache.join("local-path-helper.oci.tar"),
        ),
    ]
}

/// Imports again, from the cache, a base image `node` no longer has. A kubelet under disk
/// pressure deletes every image no running container uses, whatever the GC thresholds say,
/// and with no registry to pull from, every pod sandbox of that node then fails for good
/// (`failed to pull image "localhost/kubevirt-rs/pause:1"`) until the image is back.
fn restore_base_images(layout: &Layout, node: &Layout) -> anyhow::Result<()> {
    for (name, archive) in base_images(layout) {
        if archive.exists() && !has_image(node, name) {
            eprintln!(
                "{name} was missing from {} (deleted under disk pressure?): imported again",
                node.containerd_socket.display()
            );
            import(node, &archive)?;
        }
    }
    Ok(())
}

/// Tags an image in every node's containerd.
pub fn tag_all(layout: &Layout, from: &str, to: &str) -> anyhow::Result<()> {
    tag(layout, from, to)?;
    if super::node2::running(layout) {
        tag(&super::node2::node_layout(layout), from, to)?;
    }
    Ok(())
}

/// Imports an OCI archive into the containerd of `layout` (CRI namespace `k8s.io`).
pub fn import(layout: &Layout, archive: &Path) -> anyhow::Result<()> {
    if !layout.containerd_socket.exists() {
        bail!("the cluster's containerd is not running (run `cargo xtask cluster up` first)");
    }
    run(Command::new("ctr")
        .arg("--address")
        .arg(&layout.containerd_socket)
        .args(["--namespace", "k8s.io", "images", "import"])
        .arg(archive))
    .with_context(|| format!("importing {}", archive.display()))?;
    Ok(())
}

/// Gives image `from` the additional name `to` in the cluster's containerd (replacing what `to`
/// named before).
pub fn tag(layout: &Layout, from: &str, to: &str) -> anyhow::Result<()> {
    run(Command::new("ctr")
        .arg("--address")
        .arg(&layout.containerd_socket)
        .args([
            "--namespace",
            "k8s.io",
            "images",
            "tag",
            "--force",
            from,
            to,
        ]))
    .with_context(|| format!("tagging {from} as {to}"))?;
    Ok(())
}

/// Whether the cluster's containerd already has image `name`.
pub fn has_image(layout: &Layout, name: &str) -> bool {
    Command::new("ctr")
        .arg("--address")
        .arg(&layout.containerd_socket)
        .args(["--namespace", "k8s.io", "images", "ls", "--quiet"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l == name)
        })
        .unwrap_or(false)
}
