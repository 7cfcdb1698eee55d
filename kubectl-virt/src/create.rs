//! `create vm`: a KubeVirt-compatible VirtualMachine manifest built from the
//! shared API types, printed as YAML for `kubectl apply -f -`.

use std::hash::{BuildHasher, Hasher};

use base64::Engine;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubevirt_api::vm::VirtualMachineInstanceTemplateSpec;
use kubevirt_api::vmi::{
    CloudInitSource, ContainerDiskSource, Disk, DiskTarget, DomainSpec, Memory, Volume,
};
use kubevirt_api::{RunStrategy, VirtualMachine, VirtualMachineInstanceSpec, VirtualMachineSpec};

use crate::error::CliError;
use crate::request::validate_name;

/// virtctl's default guest memory when neither --memory nor an instancetype
/// is given.
pub const DEFAULT_MEMORY: &str = "512Mi";
/// Volume name virtctl gives cloud-init data.
pub const CLOUD_INIT_VOLUME: &str = "cloudinitdisk";

/// One `--volume-containerdisk src:IMAGE[,name:NAME][,bootorder:N]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerDiskArg {
    pub image: String,
    pub name: Option<String>,
    pub boot_order: Option<u32>,
}

impl std::str::FromStr for ContainerDiskArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut image = None;
        let mut name = None;
        let mut boot_order = None;
        for part in s.split(',') {
            let Some((k, v)) = part.split_once(':') else {
                return Err(format!(
                    "{part:?} is not key:value (expected src:IMAGE[,name:NAME][,bootorder:N])"
                ));
            };
            match k {
                // The image itself may contain ':' (tags, registry ports),
                // hence split_once rather than split.
                "src" => image = Some(v.to_owned()),
                "name" => name = Some(v.to_owned()),
                "bootorder" => {
                    boot_order =
                        Some(v.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                            format!("bootorder must be a positive integer, got {v:?}")
                        })?);
                }
                other => {
                    return Err(format!(
                        "unknown parameter {other:?} (supported: src, name, bootorder)"
                    ));
                }
            }
        }
        let image = image
            .filter(|i| !i.is_empty())
            .ok_or_else(|| "src:IMAGE is required".to_owned())?;
        Ok(Self {
            image,
            name,
            boot_order,
        })
    }
}

/// Validated inputs of `create vm`.
#[derive(Clone, Debug, PartialEq)]
pub struct CreateVm {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub memory: Option<String>,
    pub run_strategy: RunStrategy,
    pub termination_grace_period: Option<i64>,
    pub container_disks: Vec<ContainerDiskArg>,
    /// Base64, as virtctl's --cloud-init-user-data.
    pub cloud_init_user_data_base64: Option<String>,
}

/// `vm-` and five random lowercase characters, like virtctl.
pub fn random_vm_name() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    // RandomState is seeded per process from the OS, which is all the
    // randomness a throw-away default name needs.
    let mut n = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let mut s = String::from("vm-");
    for _ in 0..5 {
        let idx = usize::try_from(n % ALPHABET.len() as u64).unwrap_or(0);
        s.push(char::from(ALPHABET[idx]));
        n /= ALPHABET.len() as u64;
    }
    s
}

impl CreateVm {
    /// Builds the VirtualMachine. `name` must already be resolved.
    pub fn build(&self, name: &str) -> Result<VirtualMachine, CliError> {
        validate_name("VM name", name)?;
        let memory = self.memory.as_deref().unwrap_or(DEFAULT_MEMORY);
        if kubevirt_api::quantity::parse_bytes(memory).is_err() {
            return Err(CliError::Usage(format!(
                "invalid --memory {memory:?}: expected a quantity such as 512Mi or 2Gi"
            )));
        }
        if let Some(g) = self.termination_grace_period
            && g < 0
        {
            return Err(CliError::Usage(format!(
                "--termination-grace-period must be 0 or more, got {g}"
            )));
        }

        let mut volumes = Vec::new();
        let mut disks = Vec::new();
        for (i, cd) in self.container_disks.iter().enumerate() {
            let vol_name = cd
                .name
                .clone()
                .unwrap_or_else(|| format!("{name}-containerdisk-{i}"));
            validate_name("volume name", &vol_name)?;
            volumes.push(Volume {
                name: vol_name.clone(),
                container_disk: Some(ContainerDiskSource {
                    image: cd.image.clone(),
                    ..ContainerDiskSource::default()
                }),
                ..Volume::default()
            });
            disks.push(disk(&vol_name, cd.boot_order));
        }
        if let Some(data) = &self.cloud_init_user_data_base64 {
            if base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .is_err()
            {
                return Err(CliError::Usage(
                    "--cloud-init-user-data must be base64-encoded (e.g. $(base64 -w0 user-data.yaml))"
                        .into(),
                ));
            }
            volumes.push(Volume {
                name: CLOUD_INIT_VOLUME.to_owned(),
                cloud_init_no_cloud: Some(CloudInitSource {
                    user_data_base64: Some(data.trim().to_owned()),
                    ..CloudInitSource::default()
                }),
                ..Volume::default()
            });
            disks.push(disk(CLOUD_INIT_VOLUME, None));
        }
        let mut seen = std::collections::BTreeSet::new();
        for v in &volumes {
            if !seen.insert(v.name.as_str()) {
                return Err(CliError::Usage(format!(
                    "volume name {:?} is used twice",
                    v.name
                )));
            }
        }

        let mut domain = DomainSpec {
            memory: Some(Memory {
                guest: Some(Quantity(memory.to_owned())),
                ..Memory::default()
            }),
            ..DomainSpec::default()
        };
        // KubeVirt's mutating webhook adds a disk for every volume that has
        // none; listing them keeps the manifest bootable on servers that
        // do not.
        if !disks.is_empty() {
            domain.devices.disks = Some(disks);
        }

        let spec = VirtualMachineSpec {
            running: None,
            run_strategy: Some(self.run_strategy),
            template: VirtualMachineInstanceTemplateSpec {
                metadata: None,
                spec: Some(VirtualMachineInstanceSpec {
                    domain,
                    termination_grace_period_seconds: Some(
                        self.termination_grace_period.unwrap_or(
                            kubevirt_api::defaults::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS,
                        ),
                    ),
                    volumes: (!volumes.is_empty()).then_some(volumes),
                    ..VirtualMachineInstanceSpec::default()
                }),
            },
        };
        let mut vm = VirtualMachine::new(name, spec);
        vm.metadata = ObjectMeta {
            name: Some(name.to_owned()),
            namespace: self.namespace.clone(),
            ..ObjectMeta::default()
        };
        Ok(vm)
    }

    /// The manifest as YAML.
    pub fn to_yaml(&self, name: &str) -> Result<String, CliError> {
        let vm = self.build(name)?;
        serde_saphyr::to_string(&vm).map_err(|e| CliError::Yaml(e.to_string()))
    }
}

fn disk(name: &str, boot_order: Option<u32>) -> Disk {
    Disk {
        name: name.to_owned(),
        disk: Some(DiskTarget::default()),
        boot_order,
        ..Disk::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn base() -> CreateVm {
        CreateVm {
            name: None,
            namespace: None,
            memory: None,
            run_strategy: RunStrategy::Always,
            termination_grace_period: None,
            container_disks: vec![],
            cloud_init_user_data_base64: None,
        }
    }

    #[test]
    fn minimal_vm_golden() {
        let yaml = base().to_yaml("vm-test").unwrap();
        let expected = "\
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: vm-test
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory:
          guest: 512Mi
        devices: {}
      terminationGracePeriodSeconds: 180
";
        assert_eq!(yaml, expected, "got:\n{yaml}");
    }

    #[test]
    fn full_vm_golden() {
        let args = CreateVm {
            name: Some("fedora".into()),
            namespace: Some("dev".into()),
            memory: Some("2Gi".into()),
            run_strategy: RunStrategy::Manual,
            termination_grace_period: Some(30),
            container_disks: vec![
                "src:quay.io/containerdisks/fedora:41,bootorder:1"
                    .parse()
                    .unwrap(),
                "src:registry:5000/tools:latest,name:tools".parse().unwrap(),
            ],
            cloud_init_user_data_base64: Some("I2Nsb3VkLWNvbmZpZwo=".into()),
        };
        let yaml = args.to_yaml("fedora").unwrap();
        let expected = "\
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: fedora
  namespace: dev
spec:
  runStrategy: Manual
  template:
    spec:
      domain:
        memory:
          guest: 2Gi
        devices:
          disks:
          - name: fedora-containerdisk-0
            disk: {}
            bootOrder: 1
          - name: tools
            disk: {}
          - name: cloudinitdisk
            disk: {}
      terminationGracePeriodSeconds: 30
      volumes:
      - name: fedora-containerdisk-0
        containerDisk:
          image: quay.io/containerdisks/fedora:41
      - name: tools
        containerDisk:
          image: registry:5000/tools:latest
      - name: cloudinitdisk
        cloudInitNoCloud:
          userDataBase64: I2Nsb3VkLWNvbmZpZwo=
";
        assert_eq!(yaml, expected, "got:\n{yaml}");
    }

    #[test]
    fn yaml_parses_back_into_the_api_type() {
        let args = CreateVm {
            container_disks: vec!["src:img:1".parse().unwrap()],
            ..base()
        };
        let yaml = args.to_yaml("a").unwrap();
        let vm: VirtualMachine = serde_saphyr::from_str(&yaml).unwrap();
        let built = args.build("a").unwrap();
        assert_eq!(vm.metadata, built.metadata);
        assert_eq!(vm.spec, built.spec);
        assert!(kubevirt_api::validation::validate_vm(&vm).is_empty());
    }

    #[test]
    fn bad_inputs_are_usage_errors() {
        let bad_mem = CreateVm {
            memory: Some("lots".into()),
            ..base()
        };
        assert!(matches!(bad_mem.build("a"), Err(CliError::Usage(_))));
        let bad_b64 = CreateVm {
            cloud_init_user_data_base64: Some("#cloud-config".into()),
            ..base()
        };
        assert!(matches!(bad_b64.build("a"), Err(CliError::Usage(_))));
        assert!(matches!(base().build("Bad_Name"), Err(CliError::Usage(_))));
        let dup = CreateVm {
            container_disks: vec![
                "src:a,name:x".parse().unwrap(),
                "src:b,name:x".parse().unwrap(),
            ],
            ..base()
        };
        assert!(matches!(dup.build("a"), Err(CliError::Usage(_))));
        assert!("name:x".parse::<ContainerDiskArg>().is_err());
        assert!("src:a,size:1".parse::<ContainerDiskArg>().is_err());
        assert!("src:a,bootorder:0".parse::<ContainerDiskArg>().is_err());
    }

    #[test]
    fn random_names_are_valid() {
        let n = random_vm_name();
        assert_eq!(n.len(), 8);
        validate_name("VM name", &n).unwrap();
    }
}
