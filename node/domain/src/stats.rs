//! A running domain's statistics, as libvirt's `virConnectGetAllDomainStats` reports them
//! (the source KubeVirt's per-VMI metrics are read from), typed. The launcher reads that
//! call's typed parameters in-process (the `virt-domstats` crate) and hands them here as
//! name/value pairs ([`stats_from_fields`]); [`parse_domstats`] reads the same fields from
//! `virsh domstats --raw`'s text, which prints each parameter as `name=value`. Units are
//! libvirt's: nanoseconds, KiB for memory, bytes and counts for I/O. A field libvirt did not
//! report is `None`, so a metric of it is left out rather than exported as 0.
//!
//! Two parts come from elsewhere than `virsh domstats`, as KubeVirt's do: the guest's file
//! systems (the guest agent's `guest-get-fsinfo`, as the launcher last read it) and, on the
//! source of a live migration, libvirt's statistics of the migration job
//! (`virDomainGetJobStats`, what `virsh domjobinfo` prints).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One domain's statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DomainStats {
    /// `cpu.*`.
    #[serde(default)]
    pub cpu: CpuStats,
    /// `balloon.*`.
    #[serde(default)]
    pub memory: MemoryStats,
    /// `vcpu.<n>.*`, by vCPU index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vcpus: Vec<VcpuStats>,
    /// `net.<n>.*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nets: Vec<NetStats>,
    /// `block.<n>.*` (the top of each disk's chain only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<BlockStats>,
    /// The guest's mounted file systems, from its agent (none without a connected agent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filesystems: Vec<FileSystemStats>,
    /// The outgoing migration's job, while one runs here (the source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationJobStats>,
    /// `dirtyrate.megabytes_per_second` of the last finished measurement
    /// (`dirtyrate.calc_status` 2; libvirt's MiB per second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_rate_mib_per_second: Option<u64>,
    /// How many (vCPU, host CPU) pairs the vCPUs may run on (`virDomainGetVcpuPinInfo`: the
    /// set bits of every vCPU's map), KubeVirt's `kubevirt_vmi_node_cpu_affinity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_affinity: Option<u64>,
}

/// One guest file system (`guest-get-fsinfo`), with KubeVirt's names for its fields.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileSystemStats {
    /// The guest's device (`vda1`; `name` in the agent's answer).
    pub disk_name: String,
    /// Where it is mounted (`/`).
    pub mount_point: String,
    /// Its type (`ext4`).
    pub file_system_type: String,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Size in bytes.
    pub total_bytes: u64,
}

impl From<&kubevirt_api::guestagent::FileSystem> for FileSystemStats {
    fn from(f: &kubevirt_api::guestagent::FileSystem) -> Self {
        Self {
            disk_name: f.disk_name.clone(),
            mount_point: f.mount_point.clone(),
            file_system_type: f.file_system_type.clone(),
            used_bytes: f.used_bytes,
            total_bytes: f.total_bytes,
        }
    }
}

/// The running migration job's figures (libvirt's `VIR_DOMAIN_JOB_*` parameters), bytes and
/// bytes per second. A figure libvirt did not report is `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationJobStats {
    /// `data_total`: memory and disks to move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_total_bytes: Option<u64>,
    /// `data_processed`: moved so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_processed_bytes: Option<u64>,
    /// `data_remaining`: still to move (dirtied pages come back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_remaining_bytes: Option<u64>,
    /// The guest's memory dirty rate, bytes per second ([`Self::dirty_rate_bytes`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_dirty_rate_bps: Option<u64>,
    /// `memory_bps`: the memory transfer rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bps: Option<u64>,
}

impl MigrationJobStats {
    /// libvirt's `memory_dirty_rate` counts pages per second; KubeVirt exports it times
    /// `memory_page_size`, so only when both were reported.
    pub fn dirty_rate_bytes(pages_per_second: Option<u64>, page_size: Option<u64>) -> Option<u64> {
        Some(pages_per_second?.saturating_mul(page_size?))
    }
}

/// `cpu.time`, `cpu.user`, `cpu.system` (ns).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// vCPUs and QEMU's own threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<u64>,
    /// In user mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_ns: Option<u64>,
    /// In system mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_ns: Option<u64>,
}

/// `balloon.*` (KiB, except the fault counts). The guest's own figures (`unused`,
/// `available`, `usable`, `disk_caches`, swap and faults) arrive only when the guest runs
/// a virtio balloon driver and the domain asks for a stats period.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// `balloon.current`: memory the domain has now (virDomainGetInfo's `memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_kib: Option<u64>,
    /// `balloon.maximum`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_kib: Option<u64>,
    /// `balloon.swap_in`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_in_kib: Option<u64>,
    /// `balloon.swap_out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_out_kib: Option<u64>,
    /// `balloon.major_fault`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_fault: Option<u64>,
    /// `balloon.minor_fault`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor_fault: Option<u64>,
    /// `balloon.unused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unused_kib: Option<u64>,
    /// `balloon.available`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_kib: Option<u64>,
    /// `balloon.usable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usable_kib: Option<u64>,
    /// `balloon.disk_caches`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_caches_kib: Option<u64>,
    /// `balloon.rss`: resident set of the QEMU process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_kib: Option<u64>,
}

/// `vcpu.<n>.*`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VcpuStats {
    /// The vCPU's index (`n`).
    pub id: u32,
    /// `state`: 0 offline, 1 running, 2 blocked (virVcpuState).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<i64>,
    /// `time`, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<u64>,
    /// `wait`: waiting on I/O, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ns: Option<u64>,
    /// `delay`: runnable but waiting for a host CPU, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ns: Option<u64>,
}

/// `net.<n>.*`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetStats {
    /// `name`: the host device (the tap).
    pub name: String,
    /// The VMI's interface name, from the device's `ua-` alias, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// `rx.bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// `rx.pkts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_packets: Option<u64>,
    /// `rx.errs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    /// `rx.drop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_dropped: Option<u64>,
    /// `tx.bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// `tx.pkts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_packets: Option<u64>,
    /// `tx.errs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
    /// `tx.drop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_dropped: Option<u64>,
}

/// `block.<n>.*`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockStats {
    /// `name`: the guest target (`vda`).
    pub name: String,
    /// The VMI's disk name, from the device's `ua-` alias, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// `rd.reqs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rd_reqs: Option<u64>,
    /// `rd.bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rd_bytes: Option<u64>,
    /// `rd.times`, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rd_times_ns: Option<u64>,
    /// `wr.reqs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wr_reqs: Option<u64>,
    /// `wr.bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wr_bytes: Option<u64>,
    /// `wr.times`, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wr_times_ns: Option<u64>,
    /// `fl.reqs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fl_reqs: Option<u64>,
    /// `fl.times`, ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fl_times_ns: Option<u64>,
}

/// `virsh domstats` output that is not what it prints.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatsError {
    /// No `Domain: '…'` header.
    #[error("no domain in the statistics")]
    NoDomain,
}

/// Parses the output of `virsh domstats --raw <domain>` (one domain: a `Domain: '<name>'`
/// line, then `  <field>=<value>` lines) as [`stats_from_fields`] reads its fields.
pub fn parse_domstats(
    text: &str,
    aliases: &BTreeMap<String, String>,
) -> Result<DomainStats, StatsError> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    if !lines.next().is_some_and(|l| l.starts_with("Domain:")) {
        return Err(StatsError::NoDomain);
    }
    // A second domain: only one was asked for.
    let fields = lines
        .take_while(|l| !l.starts_with("Domain:"))
        .filter_map(|l| l.split_once('='));
    Ok(stats_from_fields(fields, aliases))
}

/// One domain's statistics from libvirt's typed parameters, each as its name and its value
/// in text (`cpu.time`, `2719482000`: what `virsh domstats --raw` prints as `key=value`).
/// Fields it does not know are skipped, and a value that is not a number leaves its field
/// unset: libvirt adds fields between versions. `aliases` maps a device's name in the
/// statistics (a tap, a disk target) to the VMI's name for it
/// ([`crate::schema::device_aliases`]).
pub fn stats_from_fields<K: AsRef<str>, V: AsRef<str>>(
    fields: impl IntoIterator<Item = (K, V)>,
    aliases: &BTreeMap<String, String>,
) -> DomainStats {
    let mut families = Families::default();
    for (key, value) in fields {
        families.field(key.as_ref(), value.as_ref());
    }
    families.finish(aliases)
}

/// The statistics being read: the indexed families are kept by index until the end
/// (libvirt lists them in order, but the index is what ties a device's fields together).
#[derive(Default)]
struct Families {
    stats: DomainStats,
    vcpus: BTreeMap<u32, VcpuStats>,
    nets: BTreeMap<u32, NetStats>,
    blocks: BTreeMap<u32, BlockStats>,
    /// `dirtyrate.calc_status` (2: measured) and `dirtyrate.megabytes_per_second`.
    dirty_rate: (Option<u64>, Option<u64>),
}

impl Families {
    fn field(&mut self, key: &str, value: &str) {
        let num = value.parse::<u64>().ok();
        let mut parts = key.splitn(3, '.');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("cpu"), Some(f), None) => {
                if let Some(slot) = cpu_slot(&mut self.stats.cpu, f) {
                    *slot = num;
                }
            }
            (Some("balloon"), Some(f), None) => {
                if let Some(slot) = balloon_slot(&mut self.stats.memory, f) {
                    *slot = num;
                }
            }
            (Some("vcpu"), Some(idx), Some(f)) => {
                let Ok(id) = idx.parse::<u32>() else { return };
                let v = self.vcpus.entry(id).or_insert_with(|| VcpuStats {
                    id,
                    ..VcpuStats::default()
                });
                vcpu_field(v, f, value);
            }
            (Some("net"), Some(idx), Some(f)) => {
                let Ok(i) = idx.parse::<u32>() else { return };
                let n = self.nets.entry(i).or_default();
                if f == "name" {
                    n.name = value.to_string();
                } else if let Some(slot) = net_slot(n, f) {
                    *slot = num;
                }
            }
            (Some("block"), Some(idx), Some(f)) => {
                let Ok(i) = idx.parse::<u32>() else { return };
                let b = self.blocks.entry(i).or_default();
                if f == "name" {
                    b.name = value.to_string();
                } else if let Some(slot) = block_slot(b, f) {
                    *slot = num;
                }
            }
            (Some("dirtyrate"), Some("calc_status"), None) => self.dirty_rate.0 = num,
            (Some("dirtyrate"), Some("megabytes_per_second"), None) => self.dirty_rate.1 = num,
            _ => {}
        }
    }

    fn finish(self, aliases: &BTreeMap<String, String>) -> DomainStats {
        let alias = |name: &str| aliases.get(name).cloned();
        // A device without a name cannot be labelled; libvirt always names them.
        DomainStats {
            vcpus: self.vcpus.into_values().collect(),
            nets: self
                .nets
                .into_values()
                .filter(|n| !n.name.is_empty())
                .map(|n| NetStats {
                    alias: alias(&n.name),
                    ..n
                })
                .collect(),
            blocks: self
                .blocks
                .into_values()
                .filter(|b| !b.name.is_empty())
                .map(|b| BlockStats {
                    alias: alias(&b.name),
                    ..b
                })
                .collect(),
            // libvirt's VIR_DOMAIN_DIRTYRATE_MEASURED: a rate still measuring (or never
            // measured) reads 0, which is no rate.
            dirty_rate_mib_per_second: match self.dirty_rate {
                (Some(2), rate) => rate,
                _ => None,
            },
            ..self.stats
        }
    }
}

/// `cpu.<f>`.
fn cpu_slot<'a>(c: &'a mut CpuStats, f: &str) -> Option<&'a mut Option<u64>> {
    Some(match f {
        "time" => &mut c.time_ns,
        "user" => &mut c.user_ns,
        "system" => &mut c.system_ns,
        _ => return None,
    })
}

/// `balloon.<f>`.
fn balloon_slot<'a>(m: &'a mut MemoryStats, f: &str) -> Option<&'a mut Option<u64>> {
    Some(match f {
        "current" => &mut m.current_kib,
        "maximum" => &mut m.maximum_kib,
        "swap_in" => &mut m.swap_in_kib,
        "swap_out" => &mut m.swap_out_kib,
        "major_fault" => &mut m.major_fault,
        "minor_fault" => &mut m.minor_fault,
        "unused" => &mut m.unused_kib,
        "available" => &mut m.available_kib,
        "usable" => &mut m.usable_kib,
        "disk_caches" => &mut m.disk_caches_kib,
        "rss" => &mut m.rss_kib,
        _ => return None,
    })
}

/// `vcpu.<n>.<f>` (`state` is an enum, signed).
fn vcpu_field(v: &mut VcpuStats, f: &str, value: &str) {
    let num = || value.parse::<u64>().ok();
    match f {
        "state" => v.state = value.parse().ok(),
        "time" => v.time_ns = num(),
        "wait" => v.wait_ns = num(),
        "delay" => v.delay_ns = num(),
        _ => {}
    }
}

/// `net.<n>.<f>`, the counters.
fn net_slot<'a>(n: &'a mut NetStats, f: &str) -> Option<&'a mut Option<u64>> {
    Some(match f {
        "rx.bytes" => &mut n.rx_bytes,
        "rx.pkts" => &mut n.rx_packets,
        "rx.errs" => &mut n.rx_errors,
        "rx.drop" => &mut n.rx_dropped,
        "tx.bytes" => &mut n.tx_bytes,
        "tx.pkts" => &mut n.tx_packets,
        "tx.errs" => &mut n.tx_errors,
        "tx.drop" => &mut n.tx_dropped,
        _ => return None,
    })
}

/// `block.<n>.<f>`, the counters.
fn block_slot<'a>(b: &'a mut BlockStats, f: &str) -> Option<&'a mut Option<u64>> {
    Some(match f {
        "rd.reqs" => &mut b.rd_reqs,
        "rd.bytes" => &mut b.rd_bytes,
        "rd.times" => &mut b.rd_times_ns,
        "wr.reqs" => &mut b.wr_reqs,
        "wr.bytes" => &mut b.wr_bytes,
        "wr.times" => &mut b.wr_times_ns,
        "fl.reqs" => &mut b.fl_reqs,
        "fl.times" => &mut b.fl_times_ns,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What virsh 9.0 printed for a running test guest (one vCPU, a tap, a disk).
    const SAMPLE: &str = "Domain: 'default_vm'
  state.state=1
  state.reason=1
  cpu.time=2719482000
  cpu.user=1760000000
  cpu.system=740000000
  cpu.cache.monitor.count=0
  cpu.haltpoll.success.time=1000
  balloon.current=262144
  balloon.maximum=262144
  balloon.swap_in=0
  balloon.swap_out=0
  balloon.major_fault=140
  balloon.minor_fault=28741
  balloon.unused=190812
  balloon.available=229908
  balloon.usable=188000
  balloon.disk_caches=10340
  balloon.last-update=1765015200
  balloon.rss=151212
  vcpu.current=1
  vcpu.maximum=1
  vcpu.0.state=1
  vcpu.0.time=2210000000
  vcpu.0.wait=0
  vcpu.0.delay=12345
  net.count=1
  net.0.name=tap0
  net.0.rx.bytes=1096
  net.0.rx.pkts=12
  net.0.rx.errs=0
  net.0.rx.drop=1
  net.0.tx.bytes=2354
  net.0.tx.pkts=20
  net.0.tx.errs=0
  net.0.tx.drop=0
  block.count=1
  block.0.name=vda
  block.0.path=/var/run/kubevirt-rs/work/disk.qcow2
  block.0.backingIndex=1
  block.0.rd.reqs=391
  block.0.rd.bytes=5361664
  block.0.rd.times=71520000
  block.0.wr.reqs=3
  block.0.wr.bytes=12288
  block.0.wr.times=930000
  block.0.fl.reqs=2
  block.0.fl.times=1270000
  block.0.allocation=200704
  block.0.capacity=1048576
  block.0.physical=200704
";

    #[test]
    fn every_family_is_read_with_libvirts_units() {
        let aliases = BTreeMap::from([
            ("tap0".to_string(), "default".to_string()),
            ("vda".to_string(), "containerdisk".to_string()),
        ]);
        let s = parse_domstats(SAMPLE, &aliases).unwrap_or_default();
        assert_eq!(
            s.cpu,
            CpuStats {
                time_ns: Some(2_719_482_000),
                user_ns: Some(1_760_000_000),
                system_ns: Some(740_000_000),
            }
        );
        assert_eq!(s.memory.current_kib, Some(262_144));
        assert_eq!(s.memory.available_kib, Some(229_908));
        assert_eq!(s.memory.usable_kib, Some(188_000));
        assert_eq!(s.memory.rss_kib, Some(151_212));
        assert_eq!(s.memory.disk_caches_kib, Some(10_340));
        assert_eq!(s.memory.major_fault, Some(140));
        assert_eq!(
            s.vcpus,
            vec![VcpuStats {
                id: 0,
                state: Some(1),
                time_ns: Some(2_210_000_000),
                wait_ns: Some(0),
                delay_ns: Some(12_345),
            }]
        );
        assert_eq!(s.nets.len(), 1);
        assert_eq!(s.nets[0].name, "tap0");
        assert_eq!(s.nets[0].alias.as_deref(), Some("default"));
        assert_eq!(s.nets[0].rx_bytes, Some(1096));
        assert_eq!(s.nets[0].rx_dropped, Some(1));
        assert_eq!(s.nets[0].tx_packets, Some(20));
        assert_eq!(s.blocks.len(), 1);
        let b = &s.blocks[0];
        assert_eq!(
            (b.name.as_str(), b.alias.as_deref()),
            ("vda", Some("containerdisk"))
        );
        assert_eq!(b.rd_bytes, Some(5_361_664));
        assert_eq!(b.rd_times_ns, Some(71_520_000));
        assert_eq!(b.wr_reqs, Some(3));
        assert_eq!(b.fl_times_ns, Some(1_270_000));
        // The typed form travels over the handler ↔ launcher socket and back unchanged.
        let json = serde_json::to_string(&s).unwrap_or_default();
        assert_eq!(serde_json::from_str::<DomainStats>(&json).ok(), Some(s));
    }

    #[test]
    fn missing_fields_stay_unset_and_junk_is_skipped() {
        let s = parse_domstats(
            "Domain: 'x'\n  cpu.time=abc\n  balloon.current=1024\n  vcpu.1.time=5\n  \
             garbage\n  net.0.rx.bytes=7\n  block.0.name=sda\n",
            &BTreeMap::new(),
        )
        .unwrap_or_default();
        assert_eq!(s.cpu.time_ns, None);
        assert_eq!(s.memory.current_kib, Some(1024));
        assert_eq!(s.memory.available_kib, None);
        assert_eq!(s.vcpus.len(), 1);
        assert_eq!((s.vcpus[0].id, s.vcpus[0].wait_ns), (1, None));
        // A network device without a name is dropped; the disk keeps its target name.
        assert!(s.nets.is_empty());
        assert_eq!(s.blocks[0].alias, None);
        assert_eq!(
            parse_domstats("error: failed\n", &BTreeMap::new()),
            Err(StatsError::NoDomain)
        );
    }

    /// The launcher's path: libvirt's typed parameters as pairs read as virsh's text does.
    #[test]
    fn fields_read_as_pairs_equal_virshs_text() {
        let aliases = BTreeMap::from([("tap0".to_string(), "default".to_string())]);
        let pairs: Vec<(String, String)> = SAMPLE
            .lines()
            .filter_map(|l| l.trim().split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let from_text = parse_domstats(SAMPLE, &aliases).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stats_from_fields(pairs, &aliases), from_text);
        assert_eq!(from_text.nets[0].alias.as_deref(), Some("default"));
        let s = stats_from_fields(
            [
                ("vcpu.0.time", "9"),
                ("vcpu.0.state", "1"),
                ("block.0.name", "vdb"),
                ("block.0.rd.bytes", "512"),
                ("state.state", "1"),
            ],
            &BTreeMap::new(),
        );
        assert_eq!((s.vcpus[0].time_ns, s.vcpus[0].state), (Some(9), Some(1)));
        assert_eq!(
            (s.blocks[0].name.as_str(), s.blocks[0].rd_bytes),
            ("vdb", Some(512))
        );
    }

    #[test]
    fn dirty_rate_is_bytes_and_needs_the_page_size() {
        assert_eq!(
            MigrationJobStats::dirty_rate_bytes(Some(1500), Some(4096)),
            Some(6_144_000)
        );
        assert_eq!(MigrationJobStats::dirty_rate_bytes(Some(1500), None), None);
        assert_eq!(MigrationJobStats::dirty_rate_bytes(None, Some(4096)), None);
    }

    #[test]
    fn the_dirty_rate_counts_once_measured() {
        let none = BTreeMap::new();
        let read = |status: &str| {
            stats_from_fields(
                [
                    ("dirtyrate.calc_status", status),
                    ("dirtyrate.calc_start_time", "348414"),
                    ("dirtyrate.calc_period", "1"),
                    ("dirtyrate.megabytes_per_second", "12"),
                ],
                &none,
            )
            .dirty_rate_mib_per_second
        };
        assert_eq!(read("2"), Some(12));
        // Measuring: libvirt reports the rate as 0 until the period ends.
        assert_eq!(read("1"), None);
        assert_eq!(read("0"), None);
    }

    #[test]
    fn file_systems_and_the_migration_job_travel_and_old_peers_read_without_them() {
        let agent = kubevirt_api::guestagent::FileSystem {
            disk_name: "vda1".into(),
            mount_point: "/".into(),
            file_system_type: "ext4".into(),
            used_bytes: 1_000_000,
            total_bytes: 8_000_000,
            ..Default::default()
        };
        let s = DomainStats {
            filesystems: vec![FileSystemStats::from(&agent)],
            migration: Some(MigrationJobStats {
                data_total_bytes: Some(300),
                data_processed_bytes: Some(100),
                data_remaining_bytes: Some(200),
                memory_dirty_rate_bps: None,
                memory_bps: Some(50),
            }),
            ..DomainStats::default()
        };
        let json = serde_json::to_string(&s).unwrap_or_default();
        assert!(json.contains(r#""diskName":"vda1""#), "{json}");
        assert!(json.contains(r#""dataTotalBytes":300"#), "{json}");
        assert!(!json.contains("memoryDirtyRateBps"), "{json}");
        assert_eq!(serde_json::from_str::<DomainStats>(&json).ok(), Some(s));
        // A launcher that predates them sends neither field; nothing is sent when empty.
        let old = serde_json::from_str::<DomainStats>(r#"{"cpu":{},"memory":{}}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(old.filesystems.is_empty() && old.migration.is_none());
        let json = serde_json::to_string(&DomainStats::default()).unwrap_or_default();
        assert!(
            !json.contains("filesystems") && !json.contains("migration"),
            "{json}"
        );
    }
}
