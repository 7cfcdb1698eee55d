//! KubeVirt's per-VMI metrics (`kubevirt_vmi_*` of virt-handler) from a domain's
//! statistics: a pure function of the VMI's identity and [`DomainStats`], so names, labels
//! and units are tested without libvirt. Names, help texts and types are KubeVirt's (its
//! `docs/observability/metrics.md`, which a test compares them with); the labels are those
//! KubeVirt's collector gives (`node`, `namespace`, `name`, the VMI's labels as
//! `kubernetes_vmi_label_*`, and `interface`, `drive`, `id`, `state`, `type`, `disk_name`,
//! `mount_point`, `file_system_type` per family; the migration families, from a collector
//! of their own in KubeVirt, carry only `node`, `namespace` and `name`); values are
//! converted to seconds and bytes as KubeVirt does.

use std::collections::BTreeMap;

use virt_domain::stats::DomainStats;

/// A metric's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (its name ends in `_total`, but for KubeVirt's
    /// `kubevirt_vmi_migration_data_total_bytes`).
    Counter,
    /// Any value.
    Gauge,
}

/// A metric: KubeVirt's name (with `_total` for counters), help and type.
#[derive(Debug, PartialEq, Eq)]
pub struct Desc {
    /// Full name.
    pub name: &'static str,
    /// Help text, as KubeVirt's.
    pub help: &'static str,
    /// Type.
    pub kind: Kind,
    /// Labels beyond `node`, `namespace`, `name` and the VMI's own labels.
    pub labels: &'static [&'static str],
    /// Whether its series carry the VMI's labels (`kubernetes_vmi_label_*`): all but the
    /// migration families, which KubeVirt's migration collector labels with the VMI's
    /// `node`, `namespace` and `name` only.
    pub vmi_labels: bool,
}

impl Desc {
    const fn counter(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Self {
            name,
            help,
            kind: Kind::Counter,
            labels,
            vmi_labels: true,
        }
    }
    const fn gauge(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Self {
            name,
            help,
            kind: Kind::Gauge,
            labels,
            vmi_labels: true,
        }
    }
    /// A migration family (see [`Desc::vmi_labels`]).
    const fn migration(mut self) -> Self {
        self.vmi_labels = false;
        self
    }
}

macro_rules! descs {
    ($($id:ident = $ctor:ident($name:literal, $help:literal, [$($l:literal),*])$(.$m:ident())?;)*) => {
        $(
            #[doc = concat!("`", $name, "`.")]
            pub const $id: Desc = Desc::$ctor($name, $help, &[$($l),*])$(.$m())?;
        )*
        /// Every per-VMI metric virt-handler exports, in exposition order.
        pub const ALL: &[&Desc] = &[$(&$id),*];
    };
}

descs! {
    CPU_USAGE = counter("kubevirt_vmi_cpu_usage_seconds_total", "Total CPU time spent in all modes (sum of both vcpu and hypervisor usage).", []);
    CPU_USER = counter("kubevirt_vmi_cpu_user_usage_seconds_total", "Total CPU time spent in user mode.", []);
    CPU_SYSTEM = counter("kubevirt_vmi_cpu_system_usage_seconds_total", "Total CPU time spent in system mode.", []);
    VCPU_SECONDS = counter("kubevirt_vmi_vcpu_seconds_total", "Total amount of time spent in each state by each vcpu (cpu_time excluding hypervisor time). Where `id` is the vcpu identifier and `state` can be one of the following: [`OFFLINE`, `RUNNING`, `BLOCKED`].", ["id", "state"]);
    VCPU_WAIT = counter("kubevirt_vmi_vcpu_wait_seconds_total", "Amount of time spent by each vcpu while waiting on I/O.", ["id"]);
    VCPU_DELAY = counter("kubevirt_vmi_vcpu_delay_seconds_total", "Amount of time spent by each vcpu waiting in the queue instead of running.", ["id"]);
    MEMORY_RESIDENT = gauge("kubevirt_vmi_memory_resident_bytes", "Resident set size of the process running the domain.", []);
    MEMORY_AVAILABLE = gauge("kubevirt_vmi_memory_available_bytes", "Amount of usable memory as seen by the domain. This value may not be accurate if a balloon driver is in use or if the guest OS does not initialize all assigned pages", []);
    MEMORY_UNUSED = gauge("kubevirt_vmi_memory_unused_bytes", "The amount of memory left completely unused by the system. Memory that is available but used for reclaimable caches should NOT be reported as free.", []);
    MEMORY_CACHED = gauge("kubevirt_vmi_memory_cached_bytes", "The amount of memory that is being used to cache I/O and is available to be reclaimed, corresponds to the sum of `Buffers` + `Cached` + `SwapCached` in `/proc/meminfo`.", []);
    MEMORY_SWAP_IN = gauge("kubevirt_vmi_memory_swap_in_traffic_bytes", "The total amount of data read from swap space of the guest in bytes.", []);
    MEMORY_SWAP_OUT = gauge("kubevirt_vmi_memory_swap_out_traffic_bytes", "The total amount of memory written out to swap space of the guest in bytes.", []);
    MEMORY_PGMAJFAULT = counter("kubevirt_vmi_memory_pgmajfault_total", "The number of page faults when disk IO was required. Page faults occur when a process makes a valid access to virtual memory that is not available. When servicing the page fault, if disk IO is required, it is considered as major fault.", []);
    MEMORY_PGMINFAULT = counter("kubevirt_vmi_memory_pgminfault_total", "The number of other page faults, when disk IO was not required. Page faults occur when a process makes a valid access to virtual memory that is not available. When servicing the page fault, if disk IO is NOT required, it is considered as minor fault.", []);
    MEMORY_ACTUAL_BALLOON = gauge("kubevirt_vmi_memory_actual_balloon_bytes", "Current balloon size in bytes.", []);
    MEMORY_USABLE = gauge("kubevirt_vmi_memory_usable_bytes", "The amount of memory which can be reclaimed by balloon without pushing the guest system to swap, corresponds to 'Available' in /proc/meminfo.", []);
    MEMORY_DOMAIN = gauge("kubevirt_vmi_memory_domain_bytes", "The amount of memory in bytes allocated to the domain. The `memory` value in domain xml file.", []);
    NET_TRAFFIC = counter("kubevirt_vmi_network_traffic_bytes_total", "[Deprecated] Total number of bytes sent and received.", ["interface", "type"]);
    NET_RX_BYTES = counter("kubevirt_vmi_network_receive_bytes_total", "Total network traffic received in bytes.", ["interface"]);
    NET_TX_BYTES = counter("kubevirt_vmi_network_transmit_bytes_total", "Total network traffic transmitted in bytes.", ["interface"]);
    NET_RX_PACKETS = counter("kubevirt_vmi_network_receive_packets_total", "Total network traffic received packets.", ["interface"]);
    NET_TX_PACKETS = counter("kubevirt_vmi_network_transmit_packets_total", "Total network traffic transmitted packets.", ["interface"]);
    NET_RX_ERRORS = counter("kubevirt_vmi_network_receive_errors_total", "Total network received error packets.", ["interface"]);
    NET_TX_ERRORS = counter("kubevirt_vmi_network_transmit_errors_total", "Total network transmitted error packets.", ["interface"]);
    NET_RX_DROPPED = counter("kubevirt_vmi_network_receive_packets_dropped_total", "The total number of rx packets dropped on vNIC interfaces.", ["interface"]);
    NET_TX_DROPPED = counter("kubevirt_vmi_network_transmit_packets_dropped_total", "The total number of tx packets dropped on vNIC interfaces.", ["interface"]);
    STORAGE_IOPS_READ = counter("kubevirt_vmi_storage_iops_read_total", "Total number of I/O read operations.", ["drive"]);
    STORAGE_IOPS_WRITE = counter("kubevirt_vmi_storage_iops_write_total", "Total number of I/O write operations.", ["drive"]);
    STORAGE_READ_BYTES = counter("kubevirt_vmi_storage_read_traffic_bytes_total", "Total number of bytes read from storage.", ["drive"]);
    STORAGE_WRITE_BYTES = counter("kubevirt_vmi_storage_write_traffic_bytes_total", "Total number of written bytes.", ["drive"]);
    STORAGE_READ_TIMES = counter("kubevirt_vmi_storage_read_times_seconds_total", "Total time spent on read operations.", ["drive"]);
    STORAGE_WRITE_TIMES = counter("kubevirt_vmi_storage_write_times_seconds_total", "Total time spent on write operations.", ["drive"]);
    STORAGE_FLUSH_REQUESTS = counter("kubevirt_vmi_storage_flush_requests_total", "Total storage flush requests.", ["drive"]);
    STORAGE_FLUSH_TIMES = counter("kubevirt_vmi_storage_flush_times_seconds_total", "Total time spent on cache flushing.", ["drive"]);
    FILESYSTEM_CAPACITY = gauge("kubevirt_vmi_filesystem_capacity_bytes", "Total VM filesystem capacity in bytes.", ["disk_name", "mount_point", "file_system_type"]);
    FILESYSTEM_USED = gauge("kubevirt_vmi_filesystem_used_bytes", "Used VM filesystem capacity in bytes.", ["disk_name", "mount_point", "file_system_type"]);
    DIRTY_RATE = gauge("kubevirt_vmi_dirty_rate_bytes_per_second", "Guest dirty-rate in bytes per second.", []);
    NODE_CPU_AFFINITY = gauge("kubevirt_vmi_node_cpu_affinity", "Number of VMI CPU affinities to node physical cores.", []);
    MIGRATION_DATA_TOTAL = counter("kubevirt_vmi_migration_data_total_bytes", "The total Guest OS data to be migrated to the new VM.", []).migration();
    MIGRATION_DATA_REMAINING = gauge("kubevirt_vmi_migration_data_remaining_bytes", "The remaining guest OS data to be migrated to the new VM.", []).migration();
    MIGRATION_DATA_PROCESSED = gauge("kubevirt_vmi_migration_data_processed_bytes", "The total Guest OS data processed and migrated to the new VM.", []).migration();
    MIGRATION_DIRTY_MEMORY_RATE = gauge("kubevirt_vmi_migration_dirty_memory_rate_bytes", "The rate of memory being dirty in the Guest OS.", []).migration();
    MIGRATION_MEMORY_TRANSFER_RATE = gauge("kubevirt_vmi_migration_disk_transfer_rate_bytes", "The rate at which the memory is being transferred.", []).migration();
}

/// Who a VMI's series belong to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmiIdentity {
    /// `status.nodeName` (this node).
    pub node: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The VMI's labels (`metadata.labels`).
    pub labels: BTreeMap<String, String>,
}

impl VmiIdentity {
    /// `node`, `namespace`, `name`.
    fn id_labels(&self) -> Vec<(String, String)> {
        vec![
            ("node".to_string(), self.node.clone()),
            ("namespace".to_string(), self.namespace.clone()),
            ("name".to_string(), self.name.clone()),
        ]
    }

    /// [`Self::id_labels`], then each VMI label as KubeVirt names it:
    /// `kubernetes_vmi_label_` + the key with `.`, `/` and `-` turned into `_`.
    fn base_labels(&self) -> Vec<(String, String)> {
        let mut l = self.id_labels();
        l.extend(self.labels.iter().map(|(k, v)| {
            let key: String = k
                .chars()
                .map(|c| if matches!(c, '.' | '/' | '-') { '_' } else { c })
                .collect();
            (format!("kubernetes_vmi_label_{key}"), v.clone())
        }));
        l
    }
}

/// One series.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Its labels.
    pub labels: Vec<(String, String)>,
    /// Its value, in seconds or bytes.
    pub value: f64,
}

/// A metric and its series.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// The metric.
    pub desc: &'static Desc,
    /// Its series (never empty).
    pub samples: Vec<Sample>,
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn bytes(kib: u64) -> f64 {
    kib as f64 * 1024.0
}

/// KubeVirt's words for libvirt's vCPU states (virVcpuState).
fn vcpu_state(state: Option<i64>) -> &'static str {
    match state {
        Some(0) => "offline",
        Some(1) => "running",
        Some(2) => "blocked",
        _ => "unknown",
    }
}

/// The series of one VMI, each with its metric, in no particular order. A statistic
/// libvirt did not report gives no series.
fn vmi_samples(id: &VmiIdentity, s: &DomainStats) -> Vec<(&'static Desc, Sample)> {
    let (base, bare) = (id.base_labels(), id.id_labels());
    let mut out = Vec::new();
    let mut push = |d: &'static Desc, extra: &[(&str, &str)], v: Option<f64>| {
        if let Some(value) = v {
            let mut labels = if d.vmi_labels {
                base.clone()
            } else {
                bare.clone()
            };
            labels.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            out.push((d, Sample { labels, value }));
        }
    };
    push(&CPU_USAGE, &[], s.cpu.time_ns.map(seconds));
    push(&CPU_USER, &[], s.cpu.user_ns.map(seconds));
    push(&CPU_SYSTEM, &[], s.cpu.system_ns.map(seconds));
    for v in &s.vcpus {
        let vid = v.id.to_string();
        let state = vcpu_state(v.state);
        push(
            &VCPU_SECONDS,
            &[("id", &vid), ("state", state)],
            v.time_ns.map(seconds),
        );
        push(&VCPU_WAIT, &[("id", &vid)], v.wait_ns.map(seconds));
        push(&VCPU_DELAY, &[("id", &vid)], v.delay_ns.map(seconds));
    }
    let m = &s.memory;
    push(&MEMORY_RESIDENT, &[], m.rss_kib.map(bytes));
    push(&MEMORY_AVAILABLE, &[], m.available_kib.map(bytes));
    push(&MEMORY_UNUSED, &[], m.unused_kib.map(bytes));
    push(&MEMORY_CACHED, &[], m.disk_caches_kib.map(bytes));
    push(&MEMORY_SWAP_IN, &[], m.swap_in_kib.map(bytes));
    push(&MEMORY_SWAP_OUT, &[], m.swap_out_kib.map(bytes));
    push(&MEMORY_PGMAJFAULT, &[], m.major_fault.map(|c| c as f64));
    push(&MEMORY_PGMINFAULT, &[], m.minor_fault.map(|c| c as f64));
    // libvirt's `balloon.current` is both: the balloon's size and virDomainGetInfo's
    // memory, which KubeVirt reports as the domain's.
    push(&MEMORY_ACTUAL_BALLOON, &[], m.current_kib.map(bytes));
    push(&MEMORY_USABLE, &[], m.usable_kib.map(bytes));
    push(&MEMORY_DOMAIN, &[], m.current_kib.map(bytes));
    let count = |c: Option<u64>| c.map(|c| c as f64);
    for n in &s.nets {
        let iface = n.alias.as_deref().unwrap_or(&n.name);
        let l = [("interface", iface)];
        push(
            &NET_TRAFFIC,
            &[("interface", iface), ("type", "rx")],
            count(n.rx_bytes),
        );
        push(
            &NET_TRAFFIC,
            &[("interface", iface), ("type", "tx")],
            count(n.tx_bytes),
        );
        push(&NET_RX_BYTES, &l, count(n.rx_bytes));
        push(&NET_TX_BYTES, &l, count(n.tx_bytes));
        push(&NET_RX_PACKETS, &l, count(n.rx_packets));
        push(&NET_TX_PACKETS, &l, count(n.tx_packets));
        push(&NET_RX_ERRORS, &l, count(n.rx_errors));
        push(&NET_TX_ERRORS, &l, count(n.tx_errors));
        push(&NET_RX_DROPPED, &l, count(n.rx_dropped));
        push(&NET_TX_DROPPED, &l, count(n.tx_dropped));
    }
    for b in &s.blocks {
        let l = [("drive", b.alias.as_deref().unwrap_or(&b.name))];
        push(&STORAGE_IOPS_READ, &l, count(b.rd_reqs));
        push(&STORAGE_IOPS_WRITE, &l, count(b.wr_reqs));
        push(&STORAGE_READ_BYTES, &l, count(b.rd_bytes));
        push(&STORAGE_WRITE_BYTES, &l, count(b.wr_bytes));
        push(&STORAGE_READ_TIMES, &l, b.rd_times_ns.map(seconds));
        push(&STORAGE_WRITE_TIMES, &l, b.wr_times_ns.map(seconds));
        push(&STORAGE_FLUSH_REQUESTS, &l, count(b.fl_reqs));
        push(&STORAGE_FLUSH_TIMES, &l, b.fl_times_ns.map(seconds));
    }
    for f in &s.filesystems {
        let l = [
            ("disk_name", f.disk_name.as_str()),
            ("mount_point", f.mount_point.as_str()),
            ("file_system_type", f.file_system_type.as_str()),
        ];
        push(&FILESYSTEM_CAPACITY, &l, count(Some(f.total_bytes)));
        push(&FILESYSTEM_USED, &l, count(Some(f.used_bytes)));
    }
    // libvirt's MiB per second, as KubeVirt converts it.
    push(
        &DIRTY_RATE,
        &[],
        s.dirty_rate_mib_per_second.map(|m| m as f64 * 1048576.0),
    );
    push(&NODE_CPU_AFFINITY, &[], count(s.cpu_affinity));
    if let Some(j) = &s.migration {
        push(&MIGRATION_DATA_TOTAL, &[], count(j.data_total_bytes));
        push(
            &MIGRATION_DATA_REMAINING,
            &[],
            count(j.data_remaining_bytes),
        );
        push(
            &MIGRATION_DATA_PROCESSED,
            &[],
            count(j.data_processed_bytes),
        );
        push(
            &MIGRATION_DIRTY_MEMORY_RATE,
            &[],
            count(j.memory_dirty_rate_bps),
        );
        push(&MIGRATION_MEMORY_TRANSFER_RATE, &[], count(j.memory_bps));
    }
    out
}

/// The metric families of every VMI whose statistics were read, in [`ALL`]'s order, each
/// family once with the series of all VMIs; families without series are left out.
pub fn families(vmis: &[(VmiIdentity, DomainStats)]) -> Vec<Family> {
    let mut by_name: BTreeMap<&'static str, Vec<Sample>> = BTreeMap::new();
    for (id, stats) in vmis {
        for (d, s) in vmi_samples(id, stats) {
            by_name.entry(d.name).or_default().push(s);
        }
    }
    ALL.iter()
        .filter_map(|d| {
            let samples = by_name.remove(d.name)?;
            Some(Family { desc: d, samples })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use virt_domain::stats::{
        BlockStats, CpuStats, FileSystemStats, MemoryStats, MigrationJobStats, NetStats, VcpuStats,
    };

    fn id(name: &str) -> VmiIdentity {
        VmiIdentity {
            node: "vm".into(),
            namespace: "default".into(),
            name: name.into(),
            labels: BTreeMap::from([("kubevirt.io/vm".into(), name.into())]),
        }
    }

    fn stats() -> DomainStats {
        DomainStats {
            cpu: CpuStats {
                time_ns: Some(2_500_000_000),
                user_ns: Some(1_000_000_000),
                system_ns: None,
            },
            memory: MemoryStats {
                current_kib: Some(262_144),
                available_kib: Some(200_000),
                rss_kib: Some(100_000),
                major_fault: Some(7),
                ..MemoryStats::default()
            },
            vcpus: vec![VcpuStats {
                id: 0,
                state: Some(1),
                time_ns: Some(1_500_000_000),
                wait_ns: Some(0),
                delay_ns: None,
            }],
            nets: vec![NetStats {
                name: "tap0".into(),
                alias: Some("default".into()),
                rx_bytes: Some(1000),
                tx_bytes: Some(2000),
                rx_packets: Some(10),
                ..NetStats::default()
            }],
            blocks: vec![BlockStats {
                name: "vda".into(),
                alias: None,
                rd_bytes: Some(4096),
                rd_times_ns: Some(250_000_000),
                ..BlockStats::default()
            }],
            filesystems: vec![FileSystemStats {
                disk_name: "vda1".into(),
                mount_point: "/".into(),
                file_system_type: "ext4".into(),
                used_bytes: 1_500_000_000,
                total_bytes: 2_000_000_000,
            }],
            migration: None,
            dirty_rate_mib_per_second: Some(3),
            cpu_affinity: Some(2),
        }
    }

    fn value(fams: &[Family], name: &str, want: &[(&str, &str)]) -> Option<f64> {
        let f = fams.iter().find(|f| f.desc.name == name)?;
        f.samples
            .iter()
            .find(|s| {
                want.iter()
                    .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|s| s.value)
    }

    #[test]
    fn units_are_seconds_and_bytes_and_labels_are_kubevirts() {
        let fams = families(&[(id("a"), stats())]);
        let vmi = [("node", "vm"), ("namespace", "default"), ("name", "a")];
        assert_eq!(
            value(&fams, "kubevirt_vmi_dirty_rate_bytes_per_second", &vmi),
            Some(3.0 * 1048576.0)
        );
        assert_eq!(
            value(&fams, "kubevirt_vmi_node_cpu_affinity", &vmi),
            Some(2.0)
        );
        assert_eq!(
            value(&fams, "kubevirt_vmi_cpu_usage_seconds_total", &vmi),
            Some(2.5)
        );
        assert_eq!(
            value(
                &fams,
                "kubevirt_vmi_vcpu_seconds_total",
                &[("id", "0"), ("state", "running"), ("name", "a")]
            ),
            Some(1.5)
        );
        assert_eq!(
            value(&fams, "kubevirt_vmi_memory_domain_bytes", &vmi),
            Some(268_435_456.0)
        );
        assert_eq!(
            value(&fams, "kubevirt_vmi_memory_available_bytes", &vmi),
            Some(204_800_000.0)
        );
        assert_eq!(
            value(&fams, "kubevirt_vmi_memory_pgmajfault_total", &vmi),
            Some(7.0)
        );
        // The VMI's interface name (its alias), not the tap.
        assert_eq!(
            value(
                &fams,
                "kubevirt_vmi_network_receive_bytes_total",
                &[("interface", "default")]
            ),
            Some(1000.0)
        );
        assert_eq!(
            value(
                &fams,
                "kubevirt_vmi_network_traffic_bytes_total",
                &[("interface", "default"), ("type", "tx")]
            ),
            Some(2000.0)
        );
        // Without an alias, libvirt's name.
        assert_eq!(
            value(
                &fams,
                "kubevirt_vmi_storage_read_times_seconds_total",
                &[("drive", "vda")]
            ),
            Some(0.25)
        );
        // The VMI's labels, as KubeVirt names them.
        assert_eq!(
            value(
                &fams,
                "kubevirt_vmi_memory_resident_bytes",
                &[("kubernetes_vmi_label_kubevirt_io_vm", "a")]
            ),
            Some(102_400_000.0)
        );
        // What libvirt did not report has no series (not a 0).
        for absent in [
            "kubevirt_vmi_cpu_system_usage_seconds_total",
            "kubevirt_vmi_vcpu_delay_seconds_total",
            "kubevirt_vmi_memory_usable_bytes",
            "kubevirt_vmi_network_transmit_errors_total",
            "kubevirt_vmi_storage_flush_requests_total",
        ] {
            assert!(fams.iter().all(|f| f.desc.name != absent), "{absent}");
        }
    }

    #[test]
    fn each_family_appears_once_with_every_vmis_series() {
        let fams = families(&[(id("a"), stats()), (id("b"), stats())]);
        let cpu: Vec<_> = fams
            .iter()
            .filter(|f| f.desc.name == "kubevirt_vmi_cpu_usage_seconds_total")
            .collect();
        assert_eq!(cpu.len(), 1);
        assert_eq!(cpu[0].samples.len(), 2);
        // Every series carries the labels its metric declares.
        for f in &fams {
            for s in &f.samples {
                for l in ["node", "namespace", "name"].iter().chain(f.desc.labels) {
                    assert!(
                        s.labels.iter().any(|(k, _)| k == l),
                        "{} lacks {l}",
                        f.desc.name
                    );
                }
            }
        }
        assert!(families(&[]).is_empty());
    }

    #[test]
    fn guest_file_systems_have_kubevirts_labels_in_bytes() {
        let fams = families(&[(id("a"), stats())]);
        let root = [
            ("name", "a"),
            ("kubernetes_vmi_label_kubevirt_io_vm", "a"),
            ("disk_name", "vda1"),
            ("mount_point", "/"),
            ("file_system_type", "ext4"),
        ];
        assert_eq!(
            value(&fams, "kubevirt_vmi_filesystem_capacity_bytes", &root),
            Some(2_000_000_000.0)
        );
        assert_eq!(
            value(&fams, "kubevirt_vmi_filesystem_used_bytes", &root),
            Some(1_500_000_000.0)
        );
        // Without a guest agent's answer, no series.
        let none = DomainStats {
            filesystems: Vec::new(),
            ..stats()
        };
        let fams = families(&[(id("a"), none)]);
        assert!(
            fams.iter()
                .all(|f| !f.desc.name.starts_with("kubevirt_vmi_filesystem_"))
        );
    }

    #[test]
    fn migration_progress_only_while_one_runs_labelled_as_kubevirts_collector() {
        let fams = families(&[(id("a"), stats())]);
        assert!(
            fams.iter()
                .all(|f| !f.desc.name.starts_with("kubevirt_vmi_migration_")),
            "no migration, no series"
        );
        let migrating = DomainStats {
            migration: Some(MigrationJobStats {
                data_total_bytes: Some(1_073_741_824),
                data_processed_bytes: Some(536_870_912),
                data_remaining_bytes: Some(536_870_912),
                memory_dirty_rate_bps: Some(4_096_000),
                memory_bps: None,
            }),
            ..stats()
        };
        let fams = families(&[(id("a"), migrating)]);
        let vmi = [("node", "vm"), ("namespace", "default"), ("name", "a")];
        for (name, want) in [
            ("kubevirt_vmi_migration_data_total_bytes", 1_073_741_824.0),
            ("kubevirt_vmi_migration_data_processed_bytes", 536_870_912.0),
            ("kubevirt_vmi_migration_data_remaining_bytes", 536_870_912.0),
            (
                "kubevirt_vmi_migration_dirty_memory_rate_bytes",
                4_096_000.0,
            ),
        ] {
            assert_eq!(value(&fams, name, &vmi), Some(want), "{name}");
            let f = fams.iter().find(|f| f.desc.name == name);
            let labels: Vec<&str> = f
                .map(|f| {
                    f.samples[0]
                        .labels
                        .iter()
                        .map(|(k, _)| k.as_str())
                        .collect()
                })
                .unwrap_or_default();
            // KubeVirt's migration collector sets these three only.
            assert_eq!(labels, ["node", "namespace", "name"], "{name}");
        }
        // A rate libvirt did not report has no series.
        assert!(
            fams.iter()
                .all(|f| f.desc.name != "kubevirt_vmi_migration_disk_transfer_rate_bytes")
        );
    }

    #[test]
    fn counters_end_in_total_and_names_are_unique() {
        // KubeVirt's one per-VMI counter named otherwise.
        let named_otherwise = ["kubevirt_vmi_migration_data_total_bytes"];
        let mut seen = std::collections::BTreeSet::new();
        for d in ALL {
            assert!(seen.insert(d.name), "{} twice", d.name);
            assert_eq!(
                d.kind == Kind::Counter,
                d.name.ends_with("_total") || named_otherwise.contains(&d.name),
                "{}",
                d.name
            );
        }
    }
}
