//! Golden-file and round-trip tests of the VMI → domain conversion.
//! Regenerate the golden files with `UPDATE_GOLDEN=1 cargo test -p virt-domain`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use kubevirt_api::VirtualMachineInstance;
use kubevirt_api::defaults::default_vmi;
use virt_domain::schema::{ChannelState, DiskFormat, DiskType, guest_agent_connected};
use virt_domain::{
    Accel, ConvertError, Domain, HostFacts, KernelBootFiles, NetworkMode, PodTap, PreparedVolume,
    domain_for,
};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata")
        .join(name)
}

fn load(name: &str) -> VirtualMachineInstance {
    let text = std::fs::read_to_string(testdata(name)).unwrap();
    let mut vmi: VirtualMachineInstance = serde_json::from_str(&text).unwrap();
    default_vmi(&mut vmi);
    assert!(
        kubevirt_api::validation::validate_vmi(&vmi).is_empty(),
        "{name} must be a valid VMI"
    );
    vmi
}

fn vol(path: &str, format: DiskFormat) -> PreparedVolume {
    PreparedVolume {
        path: path.into(),
        format,
        kind: DiskType::File,
        direct_io: true,
    }
}

fn kernelboot_host() -> HostFacts {
    let mut h = HostFacts::x86_64(Accel::Tcg);
    h.emulator = Some("/usr/bin/qemu-system-x86_64".into());
    h.volumes.insert(
        "cloudinit".into(),
        vol("/run/vmi/cloudinit.iso", DiskFormat::Raw),
    );
    h.kernel_boot = Some(KernelBootFiles {
        kernel: Some("/images/guest/vmlinuz".into()),
        initrd: Some("/images/guest/initramfs.gz".into()),
    });
    h.console_socket = Some("/run/vmi/console.sock".into());
    h.vnc_socket = Some("/run/vmi/vnc.sock".into());
    h.network = NetworkMode::User;
    h
}

fn disks_host() -> HostFacts {
    let mut h = HostFacts::x86_64(Accel::Kvm);
    h.volumes
        .insert("root".into(), vol("/run/vmi/root.qcow2", DiskFormat::Qcow2));
    h.volumes.insert(
        "scratch".into(),
        vol("/run/vmi/scratch.qcow2", DiskFormat::Qcow2),
    );
    h.volumes
        .insert("iso".into(), vol("/run/vmi/iso.qcow2", DiskFormat::Qcow2));
    h.volumes.insert(
        "data".into(),
        PreparedVolume {
            path: "/dev/sdz".into(),
            format: DiskFormat::Raw,
            kind: DiskType::Block,
            direct_io: true,
        },
    );
    h.console_socket = Some("/run/vmi/console.sock".into());
    h.nvram = Some("/run/vmi/efi-vars.fd".into());
    h
}

/// The pod network: the tap virt-handler made, the MAC the DHCP lease is for.
fn podnetwork_host() -> HostFacts {
    let mut h = HostFacts::x86_64(Accel::Tcg);
    h.network = NetworkMode::Pod;
    h.pod_tap = Some(PodTap {
        interface: "default".into(),
        device: "tap0".into(),
        mac: "02:4e:91:0c:7a:33".into(),
        mtu: 1450,
    });
    h
}

fn cases() -> Vec<(&'static str, HostFacts)> {
    vec![
        ("podnetwork", podnetwork_host()),
        ("kernelboot", kernelboot_host()),
        ("disks", disks_host()),
        ("minimal", HostFacts::x86_64(Accel::Tcg)),
    ]
}

#[test]
fn golden_files() {
    for (name, host) in cases() {
        let vmi = load(&format!("{name}.json"));
        let xml = domain_for(&vmi, &host).unwrap().to_xml().unwrap();
        let golden = testdata(&format!("{name}.xml"));
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&golden, &xml).unwrap();
        }
        let want = std::fs::read_to_string(&golden).unwrap_or_default();
        assert_eq!(
            xml,
            want,
            "{name}: domain XML differs from {}",
            golden.display()
        );
    }
}

#[test]
fn round_trip() {
    for (name, host) in cases() {
        let d = domain_for(&load(&format!("{name}.json")), &host).unwrap();
        let back = Domain::from_xml(&d.to_xml().unwrap()).unwrap();
        assert_eq!(
            back, d,
            "{name}: XML does not parse back to the same domain"
        );
    }
}

/// libvirt's own description interleaves device kinds and carries elements we do not
/// model; both must parse.
#[test]
fn parses_libvirt_live_xml() {
    let xml = r#"<domain type='qemu' id='1'>
  <name>default_guest</name>
  <uuid>5d307ca9-b3ef-428c-8861-06e72d69f223</uuid>
  <memory unit='KiB'>131072</memory>
  <currentMemory unit='KiB'>131072</currentMemory>
  <vcpu placement='static'>1</vcpu>
  <resource><partition>/machine</partition></resource>
  <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type><kernel>/k</kernel><boot dev='hd'/></os>
  <cpu mode='custom' match='exact' check='none'><model fallback='forbid'>qemu64</model></cpu>
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/a.iso' index='1'/><target dev='vda' bus='virtio'/><alias name='ua-cloudinit'/></disk>
    <controller type='usb' index='0' model='qemu-xhci'/>
    <controller type='pci' index='0' model='pcie-root'/>
    <interface type='user'><mac address='52:54:00:12:34:56'/><model type='virtio'/></interface>
    <serial type='unix'><source mode='bind' path='/c.sock'/><target type='isa-serial' port='0'><model name='isa-serial'/></target><alias name='serial0'/></serial>
    <console type='unix'><source mode='bind' path='/c.sock'/><target type='serial' port='0'/></console>
    <channel type='unix'><source mode='bind' path='/tmp/.vl-x/config/libvirt/qemu/channel/target/domain-1-default_guest/org.qemu.guest_agent.0'/><target type='virtio' name='org.qemu.guest_agent.0' state='disconnected'/><alias name='channel0'/><address type='virtio-serial' controller='0' bus='0' port='1'/></channel>
    <input type='mouse' bus='ps2'/>
    <controller type='sata' index='0'/>
    <memballoon model='virtio'/>
  </devices>
  <seclabel type='none' model='none'/>
</domain>"#;
    let d = Domain::from_xml(xml).unwrap();
    assert_eq!(d.name, "default_guest");
    assert_eq!(d.memory.value, 131072);
    assert_eq!(d.devices.controller.len(), 3);
    assert_eq!(
        d.devices.serial[0].source.as_ref().unwrap().path.as_deref(),
        Some("/c.sock")
    );
    assert_eq!(
        d.devices.channel[0].target.state,
        Some(ChannelState::Disconnected)
    );
    assert!(!guest_agent_connected(xml).unwrap());
    // Statistics name the disk by its target; the metrics by the VMI's disk name.
    assert_eq!(
        virt_domain::schema::device_aliases(xml).unwrap(),
        std::collections::BTreeMap::from([("vda".to_string(), "cloudinit".to_string())])
    );
}

/// An interface's statistics carry its host device (the tap); its `ua-` alias is the VMI's
/// interface name. Devices of libvirt's own naming (no `ua-`) are left out.
#[test]
fn device_aliases_map_taps_and_targets_to_the_vmis_names() {
    let xml = "<domain type='qemu' id='3'><name>n</name><devices>\
               <disk type='file' device='disk'><target dev='vdb' bus='virtio'/><alias name='ua-data'/></disk>\
               <disk type='file' device='cdrom'><target dev='sda' bus='sata'/><alias name='sata0-0-0'/></disk>\
               <interface type='ethernet'><mac address='52:54:00:12:34:56'/><target dev='tap0' managed='no'/>\
               <model type='virtio'/><alias name='ua-default'/></interface>\
               </devices></domain>";
    assert_eq!(
        virt_domain::schema::device_aliases(xml).unwrap(),
        std::collections::BTreeMap::from([
            ("tap0".to_string(), "default".to_string()),
            ("vdb".to_string(), "data".to_string()),
        ])
    );
}

/// The agent counts as connected only when libvirt reports its own channel's port open;
/// other channels and the inactive XML (no state) do not.
#[test]
fn guest_agent_connected_reads_the_agent_channel_state() {
    let live = |channels: &str| {
        format!(
            "<domain type='qemu' id='3'><name>n</name><devices>\
             <emulator>/usr/bin/qemu-system-x86_64</emulator>\
             <controller type='virtio-serial' index='0'><alias name='virtio-serial0'/></controller>\
             {channels}<memballoon model='virtio'/></devices></domain>"
        )
    };
    let channel = |name: &str, state: &str| {
        format!(
            "<channel type='unix'><source mode='bind' path='/s'/>\
             <target type='virtio' name='{name}'{state}/><alias name='channel0'/>\
             <address type='virtio-serial' controller='0' bus='0' port='1'/></channel>"
        )
    };
    let agent = "org.qemu.guest_agent.0";
    let samples = [
        (channel(agent, " state='connected'"), true),
        (channel(agent, " state='disconnected'"), false),
        (channel(agent, ""), false),
        (channel("org.example.other", " state='connected'"), false),
        (
            channel("org.example.other", " state='disconnected'")
                + &channel(agent, " state='connected'"),
            true,
        ),
        (String::new(), false),
    ];
    for (channels, want) in samples {
        let xml = live(&channels);
        assert_eq!(guest_agent_connected(&xml).unwrap(), want, "{xml}");
    }
    // Our own domains, as defined, have the channel but no state.
    for (name, host) in cases() {
        let xml = domain_for(&load(&format!("{name}.json")), &host)
            .unwrap()
            .to_xml()
            .unwrap();
        assert!(xml.contains(agent), "{name}: no guest agent channel");
        assert!(!guest_agent_connected(&xml).unwrap(), "{name}");
    }
}

#[test]
fn memory_is_rounded_up_to_kib() {
    let mut vmi = load("minimal.json");
    let d = domain_for(&vmi, &HostFacts::x86_64(Accel::Tcg)).unwrap();
    assert_eq!(d.memory.value, 62500, "64M = 64_000_000 bytes = 62500 KiB");
    vmi.spec.domain.memory.as_mut().unwrap().guest = Some(
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("1001".into()),
    );
    assert_eq!(
        domain_for(&vmi, &HostFacts::x86_64(Accel::Tcg))
            .unwrap()
            .memory
            .value,
        1
    );
}

#[test]
fn errors_name_the_culprit() {
    let mut vmi = load("minimal.json");
    vmi.spec.domain.memory = None;
    vmi.spec.domain.resources.as_mut().unwrap().requests = Some(
        [(
            "memory".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("12XB".into()),
        )]
        .into(),
    );
    let e = domain_for(&vmi, &HostFacts::x86_64(Accel::Tcg)).unwrap_err();
    assert_eq!(
        e,
        ConvertError::InvalidMemory {
            field: "spec.domain.resources.requests.memory".into(),
            value: "12XB".into()
        }
    );

    let vmi = load("disks.json");
    let mut host = disks_host();
    host.volumes.remove("scratch");
    assert_eq!(
        domain_for(&vmi, &host).unwrap_err(),
        ConvertError::VolumeNotPrepared {
            volume: "scratch".into()
        }
    );

    let mut vmi = load("disks.json");
    vmi.spec
        .volumes
        .as_mut()
        .unwrap()
        .retain(|v| v.name != "iso");
    let e = domain_for(&vmi, &disks_host()).unwrap_err();
    assert_eq!(e, ConvertError::VolumeNotFound { disk: "iso".into() });
    assert!(e.to_string().contains("\"iso\""));

    let vmi = load("kernelboot.json");
    let mut host = kernelboot_host();
    host.kernel_boot = None;
    assert_eq!(
        domain_for(&vmi, &host).unwrap_err(),
        ConvertError::KernelBootNotPrepared
    );
}

/// KubeVirt's defaults: `none` where the file opens with O_DIRECT, `writethrough` where it
/// does not; an explicit `none` without O_DIRECT names the disk's field; an explicit mode
/// is kept; a block device without the page cache gets native AIO.
#[test]
fn cache_mode_follows_direct_io() {
    use virt_domain::schema::{CacheMode, IoMode};
    let vmi = load("disks.json");
    let modes = |host: &HostFacts| -> Vec<(Option<CacheMode>, Option<IoMode>)> {
        domain_for(&vmi, host)
            .unwrap()
            .devices
            .disk
            .iter()
            .map(|d| (d.driver.cache, d.driver.io))
            .collect()
    };
    // root: cache none + io native asked; scratch, iso: nothing asked; data: block device.
    assert_eq!(
        modes(&disks_host()),
        [
            (Some(CacheMode::None), Some(IoMode::Native)),
            (Some(CacheMode::None), None),
            (Some(CacheMode::None), None),
            (Some(CacheMode::None), Some(IoMode::Native)),
        ]
    );
    let mut host = disks_host();
    for name in ["scratch", "data"] {
        host.volumes.get_mut(name).unwrap().direct_io = false;
    }
    assert_eq!(
        modes(&host),
        [
            (Some(CacheMode::None), Some(IoMode::Native)),
            (Some(CacheMode::Writethrough), None),
            (Some(CacheMode::None), None),
            (Some(CacheMode::Writethrough), None),
        ]
    );
    host.volumes.get_mut("root").unwrap().direct_io = false;
    let e = domain_for(&vmi, &host).unwrap_err();
    assert_eq!(
        e,
        ConvertError::DirectIoUnsupported {
            field: "spec.domain.devices.disks[0].cache".into(),
            path: "/run/vmi/root.qcow2".into(),
        }
    );
    assert!(e.to_string().contains("writethrough"), "{e}");
    let mut vmi = vmi.clone();
    vmi.spec.domain.devices.disks.as_mut().unwrap()[0].cache =
        Some(kubevirt_api::vmi::DiskCache::Writeback);
    let d = domain_for(&vmi, &host).unwrap();
    assert_eq!(d.devices.disk[0].driver.cache, Some(CacheMode::Writeback));
}

#[test]
fn tcg_never_asks_for_the_host_cpu() {
    let vmi = load("disks.json");
    let mut host = disks_host();
    host.accel = Accel::Tcg;
    let d = domain_for(&vmi, &host).unwrap();
    assert_eq!(d.type_, virt_domain::schema::DomainType::Qemu);
    let cpu = d.cpu.unwrap();
    assert_eq!(cpu.mode, None);
    assert_eq!(cpu.topology.unwrap().sockets, 2);
    assert_eq!(d.vcpu.count, 4);
}

/// A VMI with room for more sockets (LiveUpdate's maxSockets) boots with its own vCPUs
/// online out of the maximum, the topology counting every socket it may grow to.
#[test]
fn max_sockets_leave_room_for_hotplugged_vcpus() {
    let mut vmi = load("disks.json");
    let mut host = disks_host();
    host.accel = Accel::Tcg;
    let cpu = vmi.spec.domain.cpu.get_or_insert_with(Default::default);
    cpu.sockets = Some(1);
    cpu.cores = Some(2);
    cpu.threads = Some(1);
    cpu.max_sockets = Some(4);
    let d = domain_for(&vmi, &host).unwrap();
    assert_eq!((d.vcpu.current, d.vcpu.count), (Some(2), 8));
    assert_eq!(
        d.cpu.as_ref().unwrap().topology.as_ref().unwrap().sockets,
        4
    );
    let xml = d.to_xml().unwrap();
    assert!(
        xml.contains("<vcpu placement=\"static\" current=\"2\">8</vcpu>"),
        "{xml}"
    );
    // Without room (maxSockets unset or not above the sockets): no `current`.
    vmi.spec.domain.cpu.as_mut().unwrap().max_sockets = Some(1);
    let d = domain_for(&vmi, &host).unwrap();
    assert_eq!((d.vcpu.current, d.vcpu.count), (None, 2));
}

/// libvirt's RNG schema is the authority on what it accepts. `virt-xml-validate` (Debian's
/// libvirt-clients) and the `xmllint` it runs (libxml2-utils) are prerequisites, installed
/// by `cargo xtask deps`: without them this test fails rather than passing having
/// validated nothing.
#[test]
fn golden_files_validate_against_libvirt_schema() {
    for (tool, package) in [
        ("virt-xml-validate", "libvirt-clients"),
        ("xmllint", "libxml2-utils"),
    ] {
        let out = std::process::Command::new(tool)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {tool} ({e}): install {package} \
                     (`cargo xtask deps` or `apt-get install {package}`)"
                )
            });
        assert!(
            out.status.success(),
            "{tool} --version failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for (name, _) in cases() {
        let o = std::process::Command::new("virt-xml-validate")
            .arg(testdata(&format!("{name}.xml")))
            .arg("domain")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{name}.xml: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// Kernel arguments are user input: they must be escaped, not interpreted.
#[test]
fn xml_special_characters_are_escaped() {
    let mut vmi = load("kernelboot.json");
    let args = r#"console=ttyS0 x="a<b>&c" y='d'"#;
    let fw = vmi.spec.domain.firmware.as_mut().unwrap();
    fw.kernel_boot.as_mut().unwrap().kernel_args = Some(args.into());
    let xml = domain_for(&vmi, &kernelboot_host())
        .unwrap()
        .to_xml()
        .unwrap();
    assert!(xml.contains("&lt;b&gt;&amp;c"), "{xml}");
    let back = Domain::from_xml(&xml).unwrap();
    assert_eq!(back.os.cmdline.as_deref(), Some(args));
}

#[test]
fn a_hotplugged_volume_waits_for_virt_handler_and_then_takes_the_first_free_device() {
    let mut vmi = load("minimal.json");
    let add: kubevirt_api::hotplug::VirtualMachineVolumeRequest =
        serde_json::from_value(serde_json::json!({"addVolumeOptions": {
            "name": "data",
            "disk": {"disk": {"bus": "scsi"}, "serial": "data-serial"},
            "volumeSource": {"persistentVolumeClaim": {"claimName": "data-pvc"}}
        }}))
        .unwrap();
    vmi.spec = kubevirt_api::hotplug::apply(&vmi.spec, &add).unwrap();
    // Not in the domain the launcher defines, and nothing to prepare for it.
    let d = domain_for(&vmi, &HostFacts::x86_64(Accel::Tcg)).unwrap();
    assert!(!d.to_xml().unwrap().contains("data-serial"));
    let (volume, disk) = kubevirt_api::hotplug::hotplugged(&vmi.spec)[0];
    let prepared = virt_domain::PreparedVolume {
        path: "/var/run/kubevirt/hotplug-disks/data.img".into(),
        format: virt_domain::schema::DiskFormat::Raw,
        kind: virt_domain::schema::DiskType::File,
        direct_io: true,
    };
    let el =
        virt_domain::hotplug_disk(disk, volume, &prepared, &["sda".into(), "vda".into()]).unwrap();
    assert_eq!(el.target.dev, "sdb");
    let xml = el.to_xml().unwrap();
    assert!(
        xml.starts_with("<disk type=\"file\" device=\"disk\">"),
        "{xml}"
    );
    assert!(xml.contains("<serial>data-serial</serial>"), "{xml}");
    assert!(xml.contains("<alias name=\"ua-data\"/>"), "{xml}");
    // As libvirt shows it once plugged in.
    let live = format!(
        "<domain><devices><disk type='file'><source file='/work/root.qcow2'/><target dev='vda'/><alias name='ua-root'/></disk>{}</devices></domain>",
        xml.replace("</disk>", "<address type='drive'/></disk>")
    );
    let (hot, taken) =
        virt_domain::schema::live_disks(&live, kubevirt_api::hotplug::LAUNCHER_HOTPLUG_DIR)
            .unwrap();
    assert_eq!(taken, ["vda", "sdb"]);
    assert_eq!(
        hot,
        [virt_domain::schema::HotpluggedDisk {
            name: "data".into(),
            target: "sdb".into()
        }]
    );
    // A CD-ROM or a SATA disk cannot be hotplugged.
    let mut cdrom = disk.clone();
    cdrom.disk = None;
    cdrom.cdrom = Some(Default::default());
    assert!(virt_domain::hotplug_disk(&cdrom, volume, &prepared, &[]).is_err());
}
