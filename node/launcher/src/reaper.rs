//! The parent of the session-mode libvirt daemon: a child subreaper.
//!
//! libvirt double-forks QEMU, so QEMU's parent is whoever adopts orphans: PID 1 of the
//! pod (the launcher, which never waits for processes it did not spawn) or, on a host,
//! init. A QEMU that exits then stays a zombie, and libvirt — which checks that a QEMU it
//! killed is gone with `kill(pid, 0)` — waits out its whole kill timeout for a process
//! that is already dead. So the daemon runs below this small process, which adopts QEMU
//! (`PR_SET_CHILD_SUBREAPER`), reaps every child that exits, and takes its children with
//! it when the daemon ends, when it is told to stop (SIGTERM) or when the launcher dies
//! (parent-death signal): no QEMU outlives its launcher, in a pod or on a host.
//!
//! It runs as `virt-reaper LAUNCHER_PID -- PROGRAM ARGS…`, a binary of its own beside
//! virt-launcher ([`BINARY`]): re-executing the launcher would map its libraries (libvirt,
//! GnuTLS, GLib: ~15 MiB resident) once more for every VM, for a loop around `waitpid`.

use std::process::Command;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getppid};

/// The reaper's binary, found beside the launcher's.
pub const BINARY: &str = "virt-reaper";

/// Runs `program args` below a subreaper until it exits; returns the exit code for the
/// process. `expected_parent` is the launcher's PID: the parent-death signal is armed
/// here, after the exec, so a parent that ended before is caught by comparing it.
pub fn run(program: &str, args: &[String], expected_parent: i32) -> i32 {
    let signals = {
        let mut s = SigSet::empty();
        for sig in [Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT] {
            s.add(sig);
        }
        s
    };
    // Blocked before anything can arrive, taken with sigwait below. std's spawn resets
    // the child's mask, so the daemon gets default signal handling.
    if let Err(e) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&signals), None) {
        eprintln!("virt-reaper: blocking signals: {e}");
        return 1;
    }
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("virt-reaper: PR_SET_CHILD_SUBREAPER: {e}");
        return 1;
    }
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM) {
        eprintln!("virt-reaper: PR_SET_PDEATHSIG: {e}");
        return 1;
    }
    if getppid().as_raw() != expected_parent {
        return 1;
    }
    let child = match Command::new(program).args(args).spawn() {
        Ok(c) => Pid::from_raw(c.id() as i32),
        Err(e) => {
            eprintln!("virt-reaper: spawning {program}: {e}");
            return 127;
        }
    };
    loop {
        // Everything that exited so far; the daemon's own status ends the loop.
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == child => {
                    kill_children();
                    return code;
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => {
                    kill_children();
                    return 128 + sig as i32;
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        match signals.wait() {
            Ok(Signal::SIGCHLD) => {}
            Ok(_) => {
                // Asked to stop, or the launcher is gone: the daemon and QEMU go too.
                let _ = kill(child, Signal::SIGKILL);
                kill_children();
                return 143;
            }
            Err(e) => {
                eprintln!("virt-reaper: sigwait: {e}");
                let _ = kill(child, Signal::SIGKILL);
                kill_children();
                return 1;
            }
        }
    }
}

/// SIGKILLs every remaining child (adopted QEMUs included) and reaps them.
fn kill_children() {
    let me = std::process::id() as i32;
    for _ in 0..50 {
        let children = children_of(me);
        if children.is_empty() {
            return;
        }
        for pid in &children {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        while let Ok(s) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            if s == WaitStatus::StillAlive {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// PIDs whose parent is `parent`, from /proc (zombies included: they need reaping).
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| parent_in_stat(&s))
                == Some(parent)
        })
        .collect()
}

/// The PPID field of a `/proc/PID/stat` line (the command name may hold spaces and
/// parentheses, so fields are counted after its last `)`).
fn parent_in_stat(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_from_stat_line_with_odd_command_names() {
        assert_eq!(
            parent_in_stat("1234 (qemu-system-x86) S 77 1234 1234 0 -1"),
            Some(77)
        );
        assert_eq!(parent_in_stat("9 (a) b) (c) Z 1 9 9"), Some(1));
        assert_eq!(parent_in_stat("garbage"), None);
    }
}
