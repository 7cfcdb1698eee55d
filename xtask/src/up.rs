//! `cargo xtask up`: local cluster, images, kubevirt-rs, a demo VM. Every step reuses what exists,
//! so running it again is cheap and changes nothing that is current.

use std::time::Instant;

use anyhow::Context;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubevirt_api::vm::VirtualMachineInstanceTemplateSpec;
use kubevirt_api::vmi::{DomainSpec, Memory};
use kubevirt_api::{RunStrategy, VirtualMachine, VirtualMachineInstanceSpec, VirtualMachineSpec};

use crate::{cluster, deploy};

/// Arguments of `cargo xtask up`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Do not create the demo VM.
    #[arg(long)]
    pub no_demo: bool,
    /// Use the images of the last `cargo xtask images` instead of building.
    #[arg(long)]
    pub no_build: bool,
}

/// The demo VM. Halted: the controllers and node agents that would run it are not deployed yet.
fn demo_vm() -> VirtualMachine {
    let spec = VirtualMachineSpec {
        running: None,
        run_strategy: Some(RunStrategy::Halted),
        template: VirtualMachineInstanceTemplateSpec {
            metadata: None,
            spec: Some(VirtualMachineInstanceSpec {
                domain: DomainSpec {
                    memory: Some(Memory {
                        guest: Some(Quantity("128Mi".into())),
                        ..Memory::default()
                    }),
                    ..DomainSpec::default()
                },
                ..VirtualMachineInstanceSpec::default()
            }),
        },
    };
    let mut vm = VirtualMachine::new("demo", spec);
    vm.metadata = ObjectMeta {
        name: Some("demo".into()),
        namespace: Some("default".into()),
        labels: Some([("app".to_string(), "demo".to_string())].into()),
        ..ObjectMeta::default()
    };
    vm
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let start = Instant::now();
    let kubeconfig = cluster::ensure_up(None)?;
    println!("cluster up ({:.1} s)", start.elapsed().as_secs_f64());
    let report = deploy::deploy(&deploy::Args {
        kubeconfig: Some(kubeconfig.clone()),
        timeout_seconds: 180,
        no_build: args.no_build,
        ..deploy::Args::default()
    })?;
    let k = deploy::Kubectl::new(kubeconfig.clone());
    if !args.no_demo {
        let yaml = serde_saphyr::to_string(&demo_vm()).context("rendering the demo VM")?;
        // Server-side apply: creates it once, later runs leave a current object alone.
        k.run(
            &[
                "apply",
                "--server-side",
                "--field-manager=kubevirt-rs-up",
                "-f",
                "-",
            ],
            Some(&yaml),
        )
        .context("creating the demo VM")?;
    }
    let vms = k.run(&["get", "vms", "-A"], None)?;
    println!(
        "\nkubevirt-rs is up ({:.1} s).\n\n{vms}",
        start.elapsed().as_secs_f64()
    );
    let kubectl = report.kubectl.display();
    println!(
        "Next:\n  export KUBECONFIG={}\n  alias kubectl={kubectl}\n  kubectl get vms\n  \
         kubectl get vm demo -o yaml\n  kubectl explain vm.spec\n  kubectl api-resources \
         --api-group=kubevirt.io\n  kubectl virt console demo    # once the controllers and \
         virt-handler are deployed; demo is Halted until then\n\nStop everything: cargo xtask \
         cluster down",
        kubeconfig.display()
    );
    Ok(())
}
