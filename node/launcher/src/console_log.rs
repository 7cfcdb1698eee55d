//! The guest's serial console as the launcher pod's log (KubeVirt's `guest-console-log`
//! container, `kubectl logs POD -c guest-console-log`).
//!
//! QEMU appends everything the guest writes to its serial port to a file (the domain's
//! `<serial><log file=… append='on'/>`) in a directory the pod shares between its
//! containers. The `guest-console-log` container runs `virt-tail --lifeline FIFO FILE`
//! (KubeVirt's name for it), which copies that file to its stdout as it grows, so the
//! kubelet keeps the console output with a timestamp per line, rotated like any container
//! log, also when nobody is attached to the console. It is a binary of its own rather
//! than a mode of virt-launcher: it links no libvirt, so it costs a few hundred KiB per VM
//! instead of the launcher's ~15 MiB of mapped libraries.
//!
//! The file would grow without bound (QEMU writes it itself, no virtlogd rotates it), so
//! the tail empties it once it has copied more than [`TRUNCATE_AT`]: QEMU opened it with
//! `O_APPEND`, and its next write lands at the new end. Bytes written between the tail's
//! last read and the truncation are lost to the log (not to the guest or the console).
//!
//! The tail ends when the launcher does, as the image copiers do: it holds the reading
//! end of the launcher's lifeline ([`crate::lifeline::attach`]), which hangs up when the
//! kernel closes the launcher's end, however the launcher ended, so the pod completes
//! when the guest stops instead of waiting on its log container.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::lifeline::{self, Attached, LifelineError};

/// Size past which the tail empties the file it has copied.
pub const TRUNCATE_AT: u64 = 1 << 20;

/// How long the tail sleeps without an event: inotify reports every write to the file
/// and the lifeline its hang-up; this only bounds what a lost event could cost.
const IDLE: Duration = Duration::from_secs(5);

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
    /// The launcher's lifeline could not be attached to.
    #[error(transparent)]
    Lifeline(#[from] LifelineError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TailError + '_ {
    move |source| TailError::Io {
        path: path.to_path_buf(),
        source,
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

/// Waits until `file` may have grown or the launcher ended, or `timeout`.
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

    fn wait(&self, life: &Attached, timeout: Duration) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let timeout = if self.inotify.is_some() {
            timeout
        } else {
            timeout.min(Duration::from_millis(100))
        };
        let mut fds: Vec<PollFd<'_>> = self
            .inotify
            .iter()
            .map(|i| PollFd::new(i.as_fd(), PollFlags::POLLIN))
            .collect();
        match life {
            Attached::Held(f) => fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN)),
            Attached::Ended => return,
        }
        let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        if matches!(poll(&mut fds, ms), Ok(n) if n > 0)
            && let Some(i) = &self.inotify
        {
            // Drain: which event does not matter, the file is read either way.
            let _ = i.read_events();
        }
    }
}

/// Copies `log` to `out` as it grows until the launcher whose lifeline is at `lifeline`
/// ends (then what is left, and returns). Empties `log` past `truncate_at` bytes copied.
pub fn tail(
    log: &Path,
    lifeline: &Path,
    out: &mut impl Write,
    truncate_at: u64,
) -> Result<(), TailError> {
    let dir = log.parent().unwrap_or(Path::new("."));
    let wake = Wakeup::new(dir);
    let life = lifeline::attach(lifeline, lifeline::START_WAIT, lifeline::OPEN_WAIT)?;
    let mut file: Option<File> = None;
    let mut pos = 0u64;
    loop {
        // Asked before reading, so that what the launcher's QEMU wrote before it ended is
        // read in this round.
        let ended = life.hung_up(Duration::ZERO);
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
        if ended {
            return Ok(());
        }
        wake.wait(&life, IDLE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

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
    fn the_tail_follows_the_file_from_before_it_exists_until_the_launcher_ends() {
        let d = tempfile::tempdir().unwrap();
        let (log, fifo) = (d.path().join("serial0.log"), d.path().join("launcher"));
        let sink = Sink::default();
        let (l, f, mut out) = (log.clone(), fifo.clone(), sink.clone());
        let tail = std::thread::spawn(move || tail(&l, &f, &mut out, TRUNCATE_AT));
        let life = lifeline::hold(&fifo).unwrap();
        append(&log, "SeaBIOS\r\n");
        wait_until("the first line copied", || sink.text() == "SeaBIOS\r\n");
        append(&log, "login: ");
        wait_until("the partial line copied", || {
            sink.text().ends_with("login: ")
        });
        // Written just before the launcher ends: still copied.
        append(&log, "bye\n");
        drop(life);
        tail.join().unwrap().unwrap();
        assert_eq!(sink.text(), "SeaBIOS\r\nlogin: bye\n");
    }

    #[test]
    fn the_tail_empties_a_large_file_and_goes_on_at_its_new_end() {
        let d = tempfile::tempdir().unwrap();
        let (log, fifo) = (d.path().join("serial0.log"), d.path().join("launcher"));
        let life = lifeline::hold(&fifo).unwrap();
        let sink = Sink::default();
        let (l, f, mut out) = (log.clone(), fifo.clone(), sink.clone());
        let tail = std::thread::spawn(move || tail(&l, &f, &mut out, 16));
        append(&log, "0123456789abcdefXYZ\n");
        wait_until("the file emptied", || {
            sink.text().len() == 20 && std::fs::metadata(&log).unwrap().len() == 0
        });
        // O_APPEND, as QEMU writes: at the new end, so at 0.
        append(&log, "after\n");
        wait_until("copied after the truncation", || {
            sink.text().ends_with("after\n")
        });
        drop(life);
        tail.join().unwrap().unwrap();
        assert_eq!(sink.text(), "0123456789abcdefXYZ\nafter\n");
    }

    #[test]
    fn a_tail_started_after_the_launcher_ended_copies_what_is_left_and_ends() {
        let d = tempfile::tempdir().unwrap();
        let (log, fifo) = (d.path().join("serial0.log"), d.path().join("launcher"));
        drop(lifeline::hold(&fifo).unwrap());
        append(&log, "the whole boot\n");
        let mut out = Vec::new();
        tail(&log, &fifo, &mut out, TRUNCATE_AT).unwrap();
        assert_eq!(out, b"the whole boot\n");
    }
}
