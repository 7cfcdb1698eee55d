//! One domain's statistics read in-process through libvirt's `virDomainListGetStats` (the
//! single-domain form of `virConnectGetAllDomainStats`, what `virsh domstats <domain>`
//! calls), as the ordered list of typed parameters libvirt returns.
//!
//! The `virt` crate has the call (`Connect::all_domain_stats`) but leaves its records a bare
//! pointer, and the workspace forbids unsafe code everywhere else: this crate is the one place
//! that reads libvirt's records, and it hands out owned values only. Every pointer it follows
//! is freed (`virDomainStatsRecordListFree`) before [`domain_stats`] returns.

use std::ffi::CStr;
use std::fmt;

use virt::domain::Domain;
use virt::sys;

/// Why no statistics were read.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// libvirt refused the call (the domain is gone, the connection broke, …).
    #[error("libvirt domain statistics: {}", .0.message())]
    Libvirt(#[source] virt::error::Error),
    /// libvirt answered without a record for the domain: it no longer exists (libvirt skips
    /// missing domains rather than failing the call).
    #[error("libvirt returned no statistics record for the domain")]
    NoRecord,
}

/// A typed parameter's value (`virTypedParameterType`).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `VIR_TYPED_PARAM_INT`.
    Int(i32),
    /// `VIR_TYPED_PARAM_UINT`.
    UInt(u32),
    /// `VIR_TYPED_PARAM_LLONG`.
    LLong(i64),
    /// `VIR_TYPED_PARAM_ULLONG`.
    ULLong(u64),
    /// `VIR_TYPED_PARAM_DOUBLE`.
    Double(f64),
    /// `VIR_TYPED_PARAM_BOOLEAN`.
    Bool(bool),
    /// `VIR_TYPED_PARAM_STRING`.
    String(String),
}

/// As `virsh domstats --raw` prints a value (libvirt's `virTypedParameterToString`), so that
/// parsers of its text read these unchanged: a boolean as `1` or `0`; a double in Rust's
/// shortest form rather than C's `%g` (no field of the families the metrics read is one).
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(v) => write!(f, "{v}"),
            Self::UInt(v) => write!(f, "{v}"),
            Self::LLong(v) => write!(f, "{v}"),
            Self::ULLong(v) => write!(f, "{v}"),
            Self::Double(v) => write!(f, "{v}"),
            Self::Bool(v) => f.write_str(if *v { "1" } else { "0" }),
            Self::String(v) => f.write_str(v),
        }
    }
}

/// The statistics of `domain`: the families `stats` selects (`VIR_DOMAIN_STATS_*`, zero
/// for all the driver has), with `flags` (`VIR_CONNECT_GET_ALL_DOMAINS_STATS_*`; pass
/// `…_NOWAIT` so that a domain busy in a job, such as a migration, answers what it can
/// without waiting for the job). Parameters come in libvirt's order, named as virsh prints
/// them (`cpu.time`, `block.0.rd.bytes`); one of a type this crate does not know is left out.
pub fn domain_stats(
    domain: &Domain,
    stats: u32,
    flags: u32,
) -> Result<Vec<(String, Value)>, StatsError> {
    let records = Records::get(domain, stats, flags)?;
    let record = records.first().ok_or(StatsError::NoRecord)?;
    Ok(params(record)
        .iter()
        .filter_map(|p| Some((field_name(p), value(p)?)))
        .collect())
}

/// Starts libvirt's measurement of the guest's memory dirty rate over `seconds` (QEMU's
/// page sampling, `virDomainStartDirtyRateCalc`); the result appears in the `dirtyrate.*`
/// statistics ([`domain_stats`] with `VIR_DOMAIN_STATS_DIRTYRATE`) once it is done.
pub fn start_dirty_rate_calc(domain: &Domain, seconds: i32) -> Result<(), StatsError> {
    // SAFETY: the pointer is used only during the call below, while `domain` (borrowed for
    // this whole function) holds its reference.
    let dom = unsafe { domain.as_ptr() };
    // SAFETY: a live domain; the call takes plain integers and keeps no pointer.
    let rc = unsafe {
        sys::virDomainStartDirtyRateCalc(dom, seconds, sys::VIR_DOMAIN_DIRTYRATE_MODE_PAGE_SAMPLING)
    };
    if rc < 0 {
        return Err(StatsError::Libvirt(virt::error::Error::last_error()));
    }
    Ok(())
}

/// Which of the host's `host_cpus` CPUs each of the domain's `vcpus` vCPUs may run on
/// (`virDomainGetVcpuPinInfo`): one row per vCPU, one flag per host CPU.
pub fn vcpu_pin_info(
    domain: &Domain,
    vcpus: usize,
    host_cpus: usize,
) -> Result<Vec<Vec<bool>>, StatsError> {
    let maplen = host_cpus.div_ceil(8).max(1);
    let mut maps = vec![0u8; vcpus * maplen];
    let (Ok(n), Ok(len)) = (i32::try_from(vcpus), i32::try_from(maplen)) else {
        return Ok(Vec::new());
    };
    // SAFETY: the pointer is used only during the call below, while `domain` (borrowed for
    // this whole function) holds its reference.
    let dom = unsafe { domain.as_ptr() };
    // SAFETY: `maps` holds `vcpus` maps of `maplen` bytes, the sizes passed; libvirt writes
    // at most that many and keeps no pointer.
    let filled = unsafe {
        sys::virDomainGetVcpuPinInfo(
            dom,
            n,
            maps.as_mut_ptr(),
            len,
            sys::VIR_DOMAIN_AFFECT_CURRENT,
        )
    };
    if filled < 0 {
        return Err(StatsError::Libvirt(virt::error::Error::last_error()));
    }
    let filled = usize::try_from(filled).unwrap_or(0).min(vcpus);
    Ok(maps
        .chunks(maplen)
        .take(filled)
        .map(|map| {
            (0..host_cpus)
                .map(|cpu| map[cpu / 8] & (1 << (cpu % 8)) != 0)
                .collect()
        })
        .collect())
}

/// libvirt's record list, freed on drop.
struct Records {
    /// NULL-terminated array of `len` records, owned by us (from virDomainListGetStats).
    list: *mut sys::virDomainStatsRecordPtr,
    len: usize,
}

impl Records {
    fn get(domain: &Domain, stats: u32, flags: u32) -> Result<Self, StatsError> {
        // SAFETY: the pointer is used only during the call below, while `domain` (borrowed
        // for this whole function) holds its reference.
        let dom = unsafe { domain.as_ptr() };
        // virDomainListGetStats takes a NULL-terminated array of domains.
        let mut doms = [dom, std::ptr::null_mut()];
        let mut list: *mut sys::virDomainStatsRecordPtr = std::ptr::null_mut();
        // SAFETY: `doms` is a NULL-terminated array of one live domain and `list` a valid
        // out-pointer; libvirt only reads `doms` and, on success, stores a list we own.
        let n = unsafe { sys::virDomainListGetStats(doms.as_mut_ptr(), stats, &mut list, flags) };
        // Read on this thread right after the call: libvirt's last error is per thread.
        let failed = n < 0;
        let records = Self {
            list,
            len: usize::try_from(n).unwrap_or(0),
        };
        if failed {
            return Err(StatsError::Libvirt(virt::error::Error::last_error()));
        }
        Ok(records)
    }

    /// The first record (we ask for one domain), borrowed from the list.
    fn first(&self) -> Option<&sys::virDomainStatsRecord> {
        if self.len == 0 || self.list.is_null() {
            return None;
        }
        // SAFETY: `list` is non-null and holds `len` > 0 entries, so its first is readable.
        let record = unsafe { *self.list };
        // SAFETY: a non-null entry points at a record libvirt filled in; it lives until the
        // list is freed, i.e. as long as `self`, which the returned borrow is tied to.
        unsafe { record.as_ref() }
    }
}

impl Drop for Records {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: the list came from virDomainListGetStats and is freed only here, once;
            // no borrow of it outlives `self`.
            unsafe { sys::virDomainStatsRecordListFree(self.list) };
        }
    }
}

/// The record's parameters, borrowed from it.
fn params(record: &sys::virDomainStatsRecord) -> &[sys::virTypedParameter] {
    let len = usize::try_from(record.nparams).unwrap_or(0);
    if len == 0 || record.params.is_null() {
        return &[];
    }
    // SAFETY: libvirt's record holds `nparams` initialised parameters at `params`, owned by
    // the record (so alive as long as the borrow of it).
    unsafe { std::slice::from_raw_parts(record.params, len) }
}

/// The parameter's name: a NUL-terminated C string in a fixed array, read without unsafe.
fn field_name(p: &sys::virTypedParameter) -> String {
    // `c_char` is `i8` here: the cast takes the byte as it is.
    let bytes: Vec<u8> = p
        .field
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The parameter's value, read from the union member its type names; `None` for a type
/// added after this was written (or a string parameter without a string).
fn value(p: &sys::virTypedParameter) -> Option<Value> {
    let kind = u32::try_from(p.type_).ok()?;
    let v = &p.value;
    // Each arm reads only the member `type_` names, the one libvirt wrote; all members are
    // plain data.
    Some(match kind {
        // SAFETY: an INT parameter: libvirt wrote `i`.
        sys::VIR_TYPED_PARAM_INT => Value::Int(unsafe { v.i }),
        // SAFETY: a UINT parameter: libvirt wrote `ui`.
        sys::VIR_TYPED_PARAM_UINT => Value::UInt(unsafe { v.ui }),
        // SAFETY: an LLONG parameter: libvirt wrote `l`.
        sys::VIR_TYPED_PARAM_LLONG => Value::LLong(unsafe { v.l }),
        // SAFETY: a ULLONG parameter: libvirt wrote `ul`.
        sys::VIR_TYPED_PARAM_ULLONG => Value::ULLong(unsafe { v.ul }),
        // SAFETY: a DOUBLE parameter: libvirt wrote `d`.
        sys::VIR_TYPED_PARAM_DOUBLE => Value::Double(unsafe { v.d }),
        // SAFETY: a BOOLEAN parameter: libvirt wrote `b`.
        sys::VIR_TYPED_PARAM_BOOLEAN => Value::Bool(unsafe { v.b } != 0),
        // SAFETY: a STRING parameter: libvirt wrote `s` (checked for NULL by `string`).
        sys::VIR_TYPED_PARAM_STRING => Value::String(string(unsafe { v.s })?),
        _ => return None,
    })
}

/// A string parameter's text, copied out of the record.
fn string(s: *const std::os::raw::c_char) -> Option<String> {
    if s.is_null() {
        return None;
    }
    // SAFETY: a non-null string parameter is a NUL-terminated C string owned by the record,
    // alive while the record is (the caller holds a borrow of it); it is copied here.
    let text = unsafe { CStr::from_ptr(s) };
    Some(text.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use virt::connect::Connect;

    /// libvirt's test driver: a private, in-process hypervisor per connection with one
    /// running domain, `test`; no daemon needed.
    fn test_domain() -> (Connect, Domain) {
        virt::error::clear_error_callback();
        let conn = Connect::open(Some("test:///default")).expect("test driver");
        let dom = conn.lookup_domain_by_name("test").expect("its domain");
        (conn, dom)
    }

    #[test]
    fn the_test_domain_reports_its_state_as_typed_parameters() {
        let (_conn, dom) = test_domain();
        let fields = domain_stats(
            &dom,
            sys::VIR_DOMAIN_STATS_STATE,
            sys::VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT,
        )
        .expect("statistics");
        // What `virsh -c test:///default domstats --raw test` prints, in its order.
        assert_eq!(
            fields,
            vec![
                ("state.state".to_string(), Value::Int(1)),
                ("state.reason".to_string(), Value::Int(0)),
            ]
        );
        // Asked again (the record list of the first call freed): the same.
        let again = domain_stats(&dom, 0, 0).expect("statistics");
        assert!(
            again.contains(&("state.state".to_string(), Value::Int(1))),
            "{again:?}"
        );
    }

    #[test]
    fn a_domain_that_is_gone_has_no_record() {
        let (conn, _test) = test_domain();
        // A transient domain of its own: `test:///default` is one hypervisor for the whole
        // process, shared with the other tests.
        let xml = "<domain type='test'><name>gone</name><memory>8192</memory>\
                   <os><type>hvm</type></os></domain>";
        let dom = conn.create_domain_xml(xml, 0).expect("create");
        assert!(domain_stats(&dom, sys::VIR_DOMAIN_STATS_STATE, 0).is_ok());
        dom.destroy().expect("destroy");
        let e = domain_stats(&dom, sys::VIR_DOMAIN_STATS_STATE, 0).expect_err("gone");
        assert!(matches!(e, StatsError::NoRecord), "{e:?}");
    }

    #[test]
    fn the_test_domains_vcpus_may_run_anywhere() {
        let (conn, dom) = test_domain();
        let host = conn.node_info().expect("node info").cpus as usize;
        let vcpus = dom.info().expect("info").nr_virt_cpu as usize;
        let maps = vcpu_pin_info(&dom, vcpus, host).expect("pin info");
        assert_eq!(maps.len(), vcpus);
        assert!(
            maps.iter().all(|m| m.len() == host && m.iter().any(|b| *b)),
            "{maps:?}"
        );
    }

    #[test]
    fn values_print_as_virsh_raw_prints_them() {
        let shown: Vec<String> = [
            Value::Int(-1),
            Value::UInt(7),
            Value::LLong(-5_000_000_000),
            Value::ULLong(18_446_744_073_709_551_615),
            Value::Double(0.5),
            Value::Bool(true),
            Value::String("vda".into()),
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            shown,
            [
                "-1",
                "7",
                "-5000000000",
                "18446744073709551615",
                "0.5",
                "1",
                "vda"
            ]
        );
    }

    #[test]
    fn a_field_name_stops_at_its_nul() {
        let mut field = [0 as std::os::raw::c_char; 80];
        for (d, s) in field.iter_mut().zip(b"cpu.time") {
            *d = *s as std::os::raw::c_char;
        }
        let p = sys::virTypedParameter {
            field,
            type_: sys::VIR_TYPED_PARAM_ULLONG as i32,
            value: sys::_virTypedParameterValue { ul: 42 },
        };
        assert_eq!(field_name(&p), "cpu.time");
        assert_eq!(value(&p), Some(Value::ULLong(42)));
        let unknown = sys::virTypedParameter { type_: 99, ..p };
        assert_eq!(value(&unknown), None);
        let no_string = sys::virTypedParameter {
            type_: sys::VIR_TYPED_PARAM_STRING as i32,
            value: sys::_virTypedParameterValue {
                s: std::ptr::null_mut(),
            },
            ..p
        };
        assert_eq!(value(&no_string), None);
    }
}
