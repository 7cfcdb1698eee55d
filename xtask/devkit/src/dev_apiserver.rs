//! `cargo xtask dev-apiserver`: a real etcd and virt-apiserver on loopback, with a
//! kubeconfig that points kubectl straight at the server.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use virt_devenv::{DevEnv, Options};

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to write the kubeconfig.
    #[arg(long, default_value = "target/dev-apiserver/kubeconfig")]
    pub kubeconfig: PathBuf,
    /// Port of the API server (0 = a free port).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Build and run the release binary.
    #[arg(long)]
    pub release: bool,
}

/// Builds virt-apiserver and returns the binary path.
pub fn build_apiserver(release: bool) -> anyhow::Result<PathBuf> {
    let mut cmd = xtask::cargo();
    cmd.args([
        "build",
        "--quiet",
        "-p",
        "virt-apiserver",
        "--bin",
        "virt-apiserver",
    ]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().context("running cargo build")?;
    anyhow::ensure!(status.success(), "building virt-apiserver failed");
    Ok(crate::target_dir()
        .join(if release { "release" } else { "debug" })
        .join("virt-apiserver"))
}

/// Runs the command until SIGINT/SIGTERM.
pub fn run(args: Args) -> anyhow::Result<()> {
    let bin = build_apiserver(args.release)?;
    let kubeconfig = std::path::absolute(&args.kubeconfig).context("resolving --kubeconfig")?;
    let mut env = DevEnv::start(Options {
        apiserver_bin: bin,
        kubeconfig: Some(kubeconfig.clone()),
        port: args.port,
        ..Default::default()
    })
    .context("starting etcd and virt-apiserver")?;
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())
        .context("SIGINT handler")?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())
        .context("SIGTERM handler")?;
    println!("etcd       {}", env.etcd_url);
    println!("apiserver  {}", env.server_url);
    println!("kubeconfig {}", kubeconfig.display());
    println!("logs       {}", env.dir().display());
    println!(
        "try: kubectl --kubeconfig {} api-resources",
        kubeconfig.display()
    );
    println!("ready");
    while !stop.load(Ordering::Relaxed) {
        if !env.alive() {
            env.stop();
            anyhow::bail!("etcd or virt-apiserver exited unexpectedly");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    env.stop();
    eprintln!("stopped; temporary data removed");
    Ok(())
}
