//! `create vm`: a KubeVirt-compatible VirtualMachine manifest built from the
//! shared API types, printed as YAML for `kubectl apply -f -`.

use std::hash::{BuildHasher, Hasher};

use base64::Engine;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubevirt_api::vm::VirtualMachineInstanceTemplateSpec;
use kubevirt_api::vmi::{
    CloudInitSource, ContainerDiskSource, Disk, DiskTarget, DomainSpec, Memory,
    PersistentVolumeClaimVolumeSource, Volume,
};
use kubevirt_api::{RunStrategy, VirtualMachine, VirtualMachineInstanceSpec, VirtualMachineSpec};

use crate::error::CliError;
use crate::request::validate_name;

/// virtctl's default guest memory when neither --memory nor an instancetype
/// is given.
pub const DEFAULT_MEMORY: &str = "512Mi";
/// Volume name virtctl gives cloud-init data.
pub const CLOUD_INIT_VOLUME: &str = "cloudinitdisk";

/// One `--volume-containerdisk src:IMAGE[,name:NAME][,bootorder:N]` or
/// `--volume-pvc src:CLAIM[,name:NAME][,bootorder:N]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeArg {
    /// Image reference or claim name.
    pub source: String,
    pub name: Option<String>,
    pub boot_order: Option<u32>,
}

impl std::str::FromStr for VolumeArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut image = None;
        let mut name = None;
        let mut boot_order = None;
        for part in s.split(',') {
            let Some((k, v)) = part.split_once(':') else {
                return Err(format!(
                    "{part:?} is not key:value (expected src:SOURCE[,name:NAME][,bootorder:N])"
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
        let source = image
            .filter(|i| !i.is_empty())
            .ok_or_else(|| "src:SOURCE is required".to_owned())?;
        Ok(Self {
            source,
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
    pub container_disks: Vec<VolumeArg>,
    pub pvcs: Vec<VolumeArg>,
    pub cloud_init: CloudInit,
}

/// cloud-init inputs: either raw user data, or the user/password/keys that
/// virtctl turns into a generated `#cloud-config`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloudInit {
    /// Base64, as virtctl's --cloud-init-user-data.
    pub user_data_base64: Option<String>,
    /// Base64, as virtctl's --cloud-init-network-data.
    pub network_data_base64: Option<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub ssh_authorized_keys: Vec<String>,
}

#[derive(serde::Serialize)]
struct GeneratedCloudConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    password: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chpasswd: Option<ChPasswd>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    ssh_authorized_keys: &'a [String],
}

#[derive(serde::Serialize)]
struct ChPasswd {
    expire: bool,
}

fn check_base64(flag: &str, data: &str) -> Result<String, CliError> {
    let data = data.trim();
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .map(|_| data.to_owned())
        .map_err(|_| {
            CliError::Usage(format!(
                "{flag} must be base64-encoded (e.g. $(base64 -w0 FILE))"
            ))
        })
}

impl CloudInit {
    fn generates(&self) -> bool {
        self.user.is_some() || self.password.is_some() || !self.ssh_authorized_keys.is_empty()
    }

    /// The NoCloud source, if any cloud-init input was given.
    pub fn source(&self) -> Result<Option<CloudInitSource>, CliError> {
        let mut src = CloudInitSource::default();
        if let Some(d) = &self.network_data_base64 {
            src.network_data_base64 = Some(check_base64("--cloud-init-network-data", d)?);
        }
        match (&self.user_data_base64, self.generates()) {
            (Some(_), true) => {
                return Err(CliError::Usage(
                    "--cloud-init-user-data cannot be combined with --user, --password-file or --ssh-key".into(),
                ));
            }
            (Some(d), false) => {
                src.user_data_base64 = Some(check_base64("--cloud-init-user-data", d)?);
            }
            (None, true) => {
                // Serialised rather than templated so that any password or
                // key text stays valid YAML.
                let cfg = GeneratedCloudConfig {
                    user: self.user.as_deref(),
                    password: self.password.as_deref(),
                    chpasswd: self.password.as_ref().map(|_| ChPasswd { expire: false }),
                    ssh_authorized_keys: &self.ssh_authorized_keys,
                };
                let body =
                    serde_saphyr::to_string(&cfg).map_err(|e| CliError::Yaml(e.to_string()))?;
                src.user_data = Some(format!("#cloud-config\n{body}"));
            }
            (None, false) => {}
        }
        Ok((src != CloudInitSource::default()).then_some(src))
    }
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
                    image: cd.source.clone(),
                    ..ContainerDiskSource::default()
                }),
                ..Volume::default()
            });
            disks.push(disk(&vol_name, cd.boot_order));
        }
        for (i, pvc) in self.pvcs.iter().enumerate() {
            let vol_name = pvc
                .name
                .clone()
                .unwrap_or_else(|| format!("{name}-pvc-{i}"));
            validate_name("volume name", &vol_name)?;
            validate_name("claim name", &pvc.source)?;
            volumes.push(Volume {
                name: vol_name.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: pvc.source.clone(),
                    ..PersistentVolumeClaimVolumeSource::default()
                }),
                ..Volume::default()
            });
            disks.push(disk(&vol_name, pvc.boot_order));
        }
        if let Some(src) = self.cloud_init.source()? {
            volumes.push(Volume {
                name: CLOUD_INIT_VOLUME.to_owned(),
                cloud_init_no_cloud: Some(src),
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
            // The plugin's `create vm` has no --instancetype/--preference yet (upstream
            // virtctl's does, and works unchanged).
            instancetype: None,
            preference: None,
            // No --volume-import yet (upstream virtctl's works unchanged).
            data_volume_templates: None,
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
            pvcs: vec![],
            cloud_init: CloudInit::default(),
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
            pvcs: vec![],
            cloud_init: CloudInit {
                user_data_base64: Some("I2Nsb3VkLWNvbmZpZwo=".into()),
                ..CloudInit::default()
            },
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
    fn generated_cloud_config_and_pvc_golden() {
        let args = CreateVm {
            pvcs: vec!["src:data-claim,bootorder:2".parse().unwrap()],
            cloud_init: CloudInit {
                network_data_base64: Some("dmVyc2lvbjogMgo=".into()),
                user: Some("fedora".into()),
                password: Some("p: #w'd\"".into()),
                ssh_authorized_keys: vec!["ssh-ed25519 AAAAC3Nza me@host".into()],
                ..CloudInit::default()
            },
            ..base()
        };
        let yaml = args.to_yaml("vm1").unwrap();
        let expected = "\
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: vm1
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory:
          guest: 512Mi
        devices:
          disks:
          - name: vm1-pvc-0
            disk: {}
            bootOrder: 2
          - name: cloudinitdisk
            disk: {}
      terminationGracePeriodSeconds: 180
      volumes:
      - name: vm1-pvc-0
        persistentVolumeClaim:
          claimName: data-claim
      - name: cloudinitdisk
        cloudInitNoCloud:
          userData: |
            #cloud-config
            user: fedora
            password: \"p: #w'd\\\"\"
            chpasswd:
              expire: false
            ssh_authorized_keys:
            - ssh-ed25519 AAAAC3Nza me@host
          networkDataBase64: dmVyc2lvbjogMgo=
";
        assert_eq!(yaml, expected, "got:\n{yaml}");
        // The generated cloud-config parses back to the same values.
        let vm = args.build("vm1").unwrap();
        let ud = vm.spec.template.spec.unwrap().volumes.unwrap()[1]
            .cloud_init_no_cloud
            .clone()
            .unwrap()
            .user_data
            .unwrap();
        let v: serde_json::Value = serde_saphyr::from_str(&ud).unwrap();
        assert_eq!(v["password"], "p: #w'd\"");
        assert_eq!(v["ssh_authorized_keys"][0], "ssh-ed25519 AAAAC3Nza me@host");
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
            cloud_init: CloudInit {
                user_data_base64: Some("#cloud-config".into()),
                ..CloudInit::default()
            },
            ..base()
        };
        assert!(matches!(bad_b64.build("a"), Err(CliError::Usage(_))));
        let both = CreateVm {
            cloud_init: CloudInit {
                user_data_base64: Some("I2Nsb3VkLWNvbmZpZwo=".into()),
                user: Some("fedora".into()),
                ..CloudInit::default()
            },
            ..base()
        };
        assert!(matches!(both.build("a"), Err(CliError::Usage(_))));
        let bad_claim = CreateVm {
            pvcs: vec!["src:Bad_Claim".parse().unwrap()],
            ..base()
        };
        assert!(matches!(bad_claim.build("a"), Err(CliError::Usage(_))));
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
        assert!("name:x".parse::<VolumeArg>().is_err());
        assert!("src:a,size:1".parse::<VolumeArg>().is_err());
        assert!("src:a,bootorder:0".parse::<VolumeArg>().is_err());
    }

    #[test]
    fn random_names_are_valid() {
        let n = random_vm_name();
        assert_eq!(n.len(), 8);
        validate_name("VM name", &n).unwrap();
    }
}
