//! The guest's serial console as the launcher pod's log (KubeVirt's `guest-console-log`
//! container, `kubectl logs POD -c guest-console-log`).
//!
//! QEMU appends everything the guest writes to its serial port to a file (the domain's
//! `<serial><log file=… append='on'/>`) in a directory the pod shares between its
//! containers. The `guest-console-log` container runs `virt-launcher tail-console FILE`,
//! which copies that file to its stdout as it grows, so the kubelet keeps the console
//! output with a timestamp per line, rotated like any container log, also when nobody is
//! attached to the console.
//!
//! The file would grow without bound (QEMU writes it itself, no virtlogd rotates it), so
//! the tail empties it once it has copied more than [`TRUNCATE_AT`]: QEMU opened it with
//! `O_APPEND`, and its next write lands at the new end. Bytes written between the tail's
//! last read and the truncation are lost to the log (not to the guest or the console).
//!
//! The tail ends when the launcher does: the launcher holds an exclusive `flock` on
//! [`lock_path`] for its lifetime, which the kernel releases however the launcher ends, so
//! the pod completes when the guest stops instead of waiting on its log container.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

/// Argument of `virt-launcher tail-console FILE`.
pub const TAIL_ARG: &str = "tail-console";

/// Size past which the tail empties the file it has copied.
pub const TRUNCATE_AT: u64 = 1 << 20;

/// How long the tail waits for a launcher that never took its lock (it takes it before
/// anything else, so only a launcher that failed at once misses it).
const LAUNCHER_START_WAIT: Duration = Duration::from_secs(300);

/// Why the tail stopped early.
#[derive(Debug, thiserror::Error)]
pub enum TailError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The launcher never started.
    #[error("no launcher took {0} within {LAUNCHER_START_WAIT:?}")]
    NoLauncher(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TailError + '_ {
    move |source| TailError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The lock file the launcher holds beside the console log.
pub fn lock_path(log: &Path) -> PathBuf {
    let mut name = log.file_name().unwrap_or_default().to_os_string();
    name.push(".launcher-lock");
    log.with_file_name(name)
}

/// Held by the launcher for its lifetime: the tail sees it end.
#[derive(Debug)]
pub struct LauncherLock(#[allow(dead_code)] Flock<File>);

/// Takes the launcher's lock beside `log` (created if absent).
pub fn hold(log: &Path) -> Result<LauncherLock, TailError> {
    let path = lock_path(log);
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io(&path))?;
    Flock::lock(f, FlockArg::LockExclusiveNonblock)
        .map(LauncherLock)
        .map_err(|(_, e)| TailError::Io {
            path,
            source: std::io::Error::from(e),
        })
}

/// What the tail knows of the launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// No lock file yet: not started.
    NotStarted,
    /// Its lock is held.
    Running,
    /// The lock file exists and nobody holds it.
    Gone,
}

/// Whether the launcher beside `log` runs.
pub fn launcher(log: &Path) -> Launcher {
    let Ok(f) = File::open(lock_path(log)) else {
        return Launcher::NotStarted;
    };
    match Flock::lock(f, FlockArg::LockSharedNonblock) {
        Ok(_) => Launcher::Gone,
        Err(_) => Launcher::Running,
    }
}

/// Copies what `file` holds beyond `pos` to `out`; returns the new position.
fn copy_new(file: &mut File, pos: u64, out: &mut impl Write) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    // Emptied by someone else (an earlier tail of this pod, restarted): from the start.
    let mut pos = if len < pos { 0 } else { pos };
    if len == pos {
        return Ok(pos);
    }
    file.seek(SeekFrom::Start(pos))?;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        pos += n as u64;
    }
    out.flush()?;
    Ok(pos)
}

/// Waits until `file` may have grown, or `timeout`.
struct Wakeup {
    inotify: Option<nix::sys::inotify::Inotify>,
}

impl Wakeup {
    fn new(dir: &Path) -> Self {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        // Without inotify (a full instance table), polling alone still works.
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .ok()
            .filter(|i| {
                i.add_watch(
                    dir,
                    AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_CREATE | AddWatchFlags::IN_ATTRIB,
                )
                .is_ok()
            });
        Self { inotify }
    }

    fn wait(&self, timeout: Duration) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let Some(i) = &self.inotify else {
            std::thread::sleep(timeout.min(Duration::from_millis(100)));
            return;
        };
        let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(i.as_fd(), PollFlags::POLLIN)];
        if matches!(poll(&mut fds, ms), Ok(n) if n > 0) {
            // Drain: which event does not matter, the file is read either way.
            let _ = i.read_events();
        }
    }
}

/// Copies `log` to `out` as it grows until the launcher ends (then what is left, and
/// returns). Empties `log` past `truncate_at` bytes copied.
pub fn tail(log: &Path, out: &mut impl Write, truncate_at: u64) -> Result<(), TailError> {
    let dir = log.parent().unwrap_or(Path::new("."));
    let wake = Wakeup::new(dir);
    let started = Instant::now();
    let mut file: Option<File> = None;
    let mut pos = 0u64;
    loop {
        // Asked before reading, so that what the launcher's QEMU wrote before it ended is
        // read in this round.
        let state = launcher(log);
        if file.is_none() {
            file = OpenOptions::new().read(true).write(true).open(log).ok();
        }
        if let Some(f) = file.as_mut() {
            pos = copy_new(f, pos, out).map_err(io(log))?;
            if pos > truncate_at && f.metadata().map_err(io(log))?.len() == pos {
                f.set_len(0).map_err(io(log))?;
                pos = 0;
            }
        }
        match state {
            Launcher::Gone => return Ok(()),
            Launcher::NotStarted if started.elapsed() > LAUNCHER_START_WAIT => {
                return Err(TailError::NoLauncher(lock_path(log)));
            }
            _ => {}
        }
        // The lock's end makes no inotify event: look again at least every second.
        wake.wait(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn append(path: &Path, s: &str) {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(s.as_bytes()).unwrap();
    }

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn the_launcher_lock_tells_running_from_gone() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("serial0.log");
        assert_eq!(launcher(&log), Launcher::NotStarted);
        let lock = hold(&log).unwrap();
        assert_eq!(launcher(&log), Launcher::Running);
        // A second launcher of the same pod cannot take it either.
        assert!(hold(&log).is_err());
        drop(lock);
        assert_eq!(launcher(&log), Launcher::Gone);
    }

    #[test]
    fn the_tail_follows_the_file_from_before_it_exists_until_the_launcher_ends() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("serial0.log");
        let sink = Sink::default();
        let (l, mut out) = (log.clone(), sink.clone());
        let tail = std::thread::spawn(move || tail(&l, &mut out, TRUNCATE_AT));
        let lock = hold(&log).unwrap();
        append(&log, "SeaBIOS\r\n");
        wait_until("the first line copied", || sink.text() == "SeaBIOS\r\n");
        append(&log, "login: ");
        wait_until("the partial line copied", || {
            sink.text().ends_with("login: ")
        });
        // Written just before the launcher ends: still copied.
        append(&log, "bye\n");
        drop(lock);
        tail.join().unwrap().unwrap();
        assert_eq!(sink.text(), "SeaBIOS\r\nlogin: bye\n");
    }

    #[test]
    fn the_tail_empties_a_large_file_and_goes_on_at_its_new_end() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("serial0.log");
        let lock = hold(&log).unwrap();
        let sink = Sink::default();
        let (l, mut out) = (log.clone(), sink.clone());
        let tail = std::thread::spawn(move || tail(&l, &mut out, 16));
        append(&log, "0123456789abcdefXYZ\n");
        wait_until("the file emptied", || {
            sink.text().len() == 20 && std::fs::metadata(&log).unwrap().len() == 0
        });
        // O_APPEND, as QEMU writes: at the new end, so at 0.
        append(&log, "after\n");
        wait_until("copied after the truncation", || {
            sink.text().ends_with("after\n")
        });
        drop(lock);
        tail.join().unwrap().unwrap();
        assert_eq!(sink.text(), "0123456789abcdefXYZ\nafter\n");
    }

    #[test]
    fn the_lock_file_sits_beside_the_log() {
        assert_eq!(
            lock_path(Path::new("/run/console/serial0.log")),
            PathBuf::from("/run/console/serial0.log.launcher-lock")
        );
    }
}
