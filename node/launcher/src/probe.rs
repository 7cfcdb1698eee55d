//! Does KVM really work? `/dev/kvm` can exist and still hang (nested virtualisation),
//! so boot a kernel under KVM and wait for its first console line, with a timeout.
//! The answer is cached per boot, because a hung probe costs seconds and a CPU.
//!
//! Blocking; call it from `spawn_blocking`.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use virt_domain::Accel;

/// Where the per-boot probe result is kept.
pub const CACHE_FILE: &str = "/run/kubevirt-rs/kvm-probe";

/// Outcome of a probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvmProbe {
    /// Whether KVM booted a kernel.
    pub usable: bool,
    /// Why not, when not.
    pub detail: String,
}

fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The newest kernel in /boot, to probe with when the VMI brings none.
pub fn host_kernel() -> Option<PathBuf> {
    let mut k: Vec<PathBuf> = fs::read_dir("/boot")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .collect();
    k.sort();
    k.pop()
}

/// Probes KVM (or returns the cached answer for this boot).
pub fn probe_kvm(kernel: Option<&Path>, timeout: Duration, cache: Option<&Path>) -> KvmProbe {
    if fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return KvmProbe {
            usable: false,
            detail: "/dev/kvm is missing or not accessible".into(),
        };
    }
    let id = boot_id();
    if let Some(c) = cache
        && let Ok(s) = fs::read_to_string(c)
        && let Some((bid, verdict)) = s.trim().split_once(' ')
        && bid == id
    {
        return KvmProbe {
            usable: verdict == "kvm",
            detail: format!("cached in {}", c.display()),
        };
    }
    let Some(kernel) = kernel.map(Path::to_path_buf).or_else(host_kernel) else {
        return KvmProbe {
            usable: false,
            detail: "no kernel to probe KVM with".into(),
        };
    };
    let result = boot_once(&kernel, timeout);
    if let Some(c) = cache {
        if let Some(parent) = c.parent() {
            let _ = fs::create_dir_all(parent);
        }
        let _ = fs::write(
            c,
            format!("{id} {}\n", if result.usable { "kvm" } else { "tcg" }),
        );
    }
    result
}

fn boot_once(kernel: &Path, timeout: Duration) -> KvmProbe {
    let child = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "kvm",
            "-M",
            "pc",
            "-m",
            "256",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
        ])
        .args([
            "-serial",
            "stdio",
            "-monitor",
            "none",
            "-no-reboot",
            "-kernel",
        ])
        .arg(kernel)
        .args(["-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return KvmProbe {
                usable: false,
                detail: format!("cannot run qemu-system-x86_64: {e}"),
            };
        }
    };
    let (tx, rx) = mpsc::channel();
    if let Some(mut out) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
                if seen.windows(13).any(|w| w == b"Linux version") {
                    let _ = tx.send(());
                    return;
                }
            }
        });
    }
    let usable = rx.recv_timeout(timeout).is_ok();
    let _ = child.kill();
    // A vCPU stuck in nested KVM can take a while to die; reap it off the caller's path.
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    KvmProbe {
        usable,
        detail: if usable {
            "KVM booted a kernel".into()
        } else {
            format!("KVM did not boot {} within {timeout:?}", kernel.display())
        },
    }
}

/// What the caller asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccelChoice {
    /// KVM when it works, else TCG if emulation is allowed.
    Auto,
    /// KVM, no fallback.
    Kvm,
    /// TCG.
    Tcg,
}

/// Decides the accelerator; `Err` carries why KVM is needed but unusable.
pub fn choose(
    choice: AccelChoice,
    allow_emulation: bool,
    probe: impl FnOnce() -> KvmProbe,
) -> Result<(Accel, String), String> {
    match choice {
        AccelChoice::Tcg => Ok((Accel::Tcg, "TCG requested".into())),
        AccelChoice::Kvm => Ok((Accel::Kvm, "KVM requested".into())),
        AccelChoice::Auto => {
            let p = probe();
            if p.usable {
                Ok((Accel::Kvm, p.detail))
            } else if allow_emulation {
                Ok((Accel::Tcg, format!("software emulation: {}", p.detail)))
            } else {
                Err(format!(
                    "KVM is not usable ({}) and emulation is not allowed",
                    p.detail
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falls_back_only_when_allowed() {
        let bad = || KvmProbe {
            usable: false,
            detail: "hangs".into(),
        };
        assert_eq!(
            choose(AccelChoice::Auto, true, bad).map(|r| r.0),
            Ok(Accel::Tcg)
        );
        assert!(choose(AccelChoice::Auto, false, bad).is_err());
        let good = || KvmProbe {
            usable: true,
            detail: "ok".into(),
        };
        assert_eq!(
            choose(AccelChoice::Auto, false, good).map(|r| r.0),
            Ok(Accel::Kvm)
        );
        assert_eq!(
            choose(AccelChoice::Tcg, false, good).map(|r| r.0),
            Ok(Accel::Tcg)
        );
    }
}
