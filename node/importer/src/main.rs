//! `virt-importer` binary.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use virt_importer::checksum::Checksum;
use virt_importer::progress::Progress;
use virt_importer::{COMPLETED, CloneConfig, Config, ImportError, termination_message};

/// CDI's worker: fills a claim with a disk image (DataVolumes).
#[derive(Parser, Debug)]
#[command(name = "virt-importer", version)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Imports a disk image from an HTTP(S) URL into a claim.
    Import(ImportArgs),
    /// Copies a claim's disk into another claim (a DataVolume's `pvc` source).
    Clone(CloneArgs),
    /// Accepts one disk image as an HTTP request body (through the upload proxy) into a
    /// claim: a DataVolume's `upload` source.
    UploadServer(UploadArgs),
}

#[derive(clap::Args, Debug)]
struct UploadArgs {
    /// Address to listen on (plain HTTP inside the pod network; the proxy terminates TLS).
    #[arg(long, env = "VIRT_IMPORTER_LISTEN", default_value = "0.0.0.0:8080")]
    listen: std::net::SocketAddr,
    /// A Filesystem claim's mount directory (the disk becomes DIR/disk.img) or a block
    /// device.
    #[arg(long, env = "VIRT_IMPORTER_TARGET")]
    target: PathBuf,
    /// Usable bytes of the target (bytes or a quantity, e.g. 64Mi): the size of disk.img.
    #[arg(long, env = "VIRT_IMPORTER_SIZE", value_parser = virt_importer::units::parse_size)]
    size: Option<u64>,
    /// Directory to spool images qemu-img converts. Default: the target's directory.
    #[arg(long, env = "VIRT_IMPORTER_SCRATCH")]
    scratch: Option<PathBuf>,
    /// Where the result goes: one JSON line {"reason", "message"}.
    #[arg(
        long,
        env = "VIRT_IMPORTER_TERMINATION_LOG",
        default_value = "/dev/termination-log"
    )]
    termination_log: PathBuf,
    /// JSON progress, rewritten as the upload goes.
    #[arg(long, env = "VIRT_IMPORTER_PROGRESS_FILE")]
    progress_file: Option<PathBuf>,
    /// The qemu-img to run.
    #[arg(long, env = "VIRT_IMPORTER_QEMU_IMG", default_value = "qemu-img")]
    qemu_img: PathBuf,
}

#[derive(clap::Args, Debug)]
struct CloneArgs {
    /// The source claim's mount directory (its disk.img is copied) or block device.
    #[arg(long, env = "VIRT_IMPORTER_SOURCE")]
    source: PathBuf,
    /// The target claim's mount directory (the disk becomes DIR/disk.img) or block device.
    #[arg(long, env = "VIRT_IMPORTER_TARGET")]
    target: PathBuf,
    /// Usable bytes of the target (bytes or a quantity, e.g. 64Mi): the size of disk.img;
    /// a larger source fails with ImageTooLarge. Default for a device: its size.
    #[arg(long, env = "VIRT_IMPORTER_SIZE", value_parser = virt_importer::units::parse_size)]
    size: Option<u64>,
    /// Where the result goes: one JSON line {"reason", "message"}.
    #[arg(
        long,
        env = "VIRT_IMPORTER_TERMINATION_LOG",
        default_value = "/dev/termination-log"
    )]
    termination_log: PathBuf,
    /// JSON progress, rewritten as the copy goes.
    #[arg(long, env = "VIRT_IMPORTER_PROGRESS_FILE")]
    progress_file: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct ImportArgs {
    /// The image's URL (http or https).
    #[arg(long, env = "VIRT_IMPORTER_URL")]
    url: String,
    /// A Filesystem claim's mount directory (the disk becomes DIR/disk.img) or a block
    /// device.
    #[arg(long, env = "VIRT_IMPORTER_TARGET")]
    target: PathBuf,
    /// Usable bytes of the target (bytes or a quantity, e.g. 64Mi): the size of disk.img;
    /// an image larger than this fails with ImageTooLarge. Default for a device: its size.
    #[arg(long, env = "VIRT_IMPORTER_SIZE", value_parser = virt_importer::units::parse_size)]
    size: Option<u64>,
    /// Expected digest of the downloaded bytes: sha256:HEX (also md5, sha1, sha512).
    #[arg(long, env = "VIRT_IMPORTER_CHECKSUM")]
    checksum: Option<Checksum>,
    /// Directory of PEM CA files trusted for https besides the built-in roots.
    #[arg(long, env = "VIRT_IMPORTER_CERT_DIR")]
    cert_dir: Option<PathBuf>,
    /// Directory with the files accessKeyId and secretKey: HTTP basic auth.
    #[arg(long, env = "VIRT_IMPORTER_SECRET_DIR")]
    secret_dir: Option<PathBuf>,
    /// An extra request header, `Name: value` (repeatable; in the environment one per line).
    #[arg(
        long = "extra-header",
        env = "VIRT_IMPORTER_EXTRA_HEADERS",
        value_delimiter = '\n'
    )]
    extra_headers: Vec<String>,
    /// Directory of files holding one `Name: value` header each (a Secret's keys).
    #[arg(long, env = "VIRT_IMPORTER_EXTRA_HEADER_DIR")]
    extra_header_dir: Option<PathBuf>,
    /// Directory to spool images qemu-img converts (qcow2, vmdk, …). Default: the target's
    /// directory (hidden temporary file); required for a block device target.
    #[arg(long, env = "VIRT_IMPORTER_SCRATCH")]
    scratch: Option<PathBuf>,
    /// Where the result goes: one JSON line {"reason", "message"}.
    #[arg(
        long,
        env = "VIRT_IMPORTER_TERMINATION_LOG",
        default_value = "/dev/termination-log"
    )]
    termination_log: PathBuf,
    /// JSON progress, rewritten as the import goes.
    #[arg(long, env = "VIRT_IMPORTER_PROGRESS_FILE")]
    progress_file: Option<PathBuf>,
    /// The qemu-img to run.
    #[arg(long, env = "VIRT_IMPORTER_QEMU_IMG", default_value = "qemu-img")]
    qemu_img: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |p| {
        hook(p);
        std::process::abort()
    }));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            // A bad flag is the pod spec's fault: said where the controller looks, too.
            let log = std::env::var_os("VIRT_IMPORTER_TERMINATION_LOG")
                .map_or_else(|| PathBuf::from("/dev/termination-log"), PathBuf::from);
            write_termination(&log, "InvalidArgument", &e.to_string());
            e.exit()
        }
    };
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "virt-importer started");
    match args.command {
        Command::Import(a) => run_import(a),
        Command::Clone(a) => run_clone(a),
        Command::UploadServer(a) => run_upload(a),
    }
}

fn run_import(a: ImportArgs) -> anyhow::Result<()> {
    let cfg = Config {
        url: a.url,
        target: a.target,
        size: a.size,
        checksum: a.checksum,
        cert_dir: a.cert_dir,
        secret_dir: a.secret_dir,
        extra_headers: a
            .extra_headers
            .into_iter()
            .filter(|h| !h.trim().is_empty())
            .collect(),
        extra_header_dir: a.extra_header_dir,
        scratch: a.scratch,
        progress_file: a.progress_file.clone(),
        qemu_img: a.qemu_img,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut progress = Progress::new(a.progress_file);
    let result = rt
        .block_on(virt_importer::import(&cfg, &mut progress))
        .map(|outcome| outcome.message());
    finish(&a.termination_log, "import", result)
}

fn run_upload(a: UploadArgs) -> anyhow::Result<()> {
    let cfg = virt_importer::upload::UploadConfig {
        target: a.target,
        size: a.size,
        scratch: a.scratch,
        progress_file: a.progress_file,
        qemu_img: a.qemu_img,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .map_err(|e| ImportError::InvalidArgument(format!("listening on {}: {e}", a.listen)))?;
        virt_importer::upload::serve(cfg, listener).await
    });
    finish(
        &a.termination_log,
        "upload",
        result.map(|outcome| outcome.message()),
    )
}

/// A clone is plain file I/O: run on this thread, no async runtime.
fn run_clone(a: CloneArgs) -> anyhow::Result<()> {
    let cfg = CloneConfig {
        source: a.source,
        target: a.target,
        size: a.size,
    };
    let mut progress = Progress::new(a.progress_file);
    let result = virt_importer::clone(&cfg, &mut progress).map(|outcome| outcome.message());
    finish(&a.termination_log, "clone", result)
}

/// Writes the result where the controller reads it; a failure exits 1 (kubelet retries).
fn finish(log: &Path, what: &str, result: Result<String, ImportError>) -> anyhow::Result<()> {
    match result {
        Ok(message) => {
            tracing::info!(task = what, %message, "complete");
            write_termination(log, COMPLETED, &message);
            Ok(())
        }
        Err(e) => {
            let reason = e.reason();
            let message = e.to_string();
            tracing::error!(task = what, reason, %message, "failed");
            write_termination(log, reason, &message);
            std::process::exit(1)
        }
    }
}

fn write_termination(path: &Path, reason: &str, message: &str) {
    if let Err(e) = std::fs::write(path, termination_message(reason, message)) {
        tracing::warn!(file = %path.display(), error = %e, "cannot write the termination message");
    }
}
