//! The launcher's lifeline and its image copiers.
//!
//! A launcher pod copies the VMI's container images (containerDisks, the kernelBoot
//! container) out with one container per image running beside the launcher (virt-
//! controller's `copier_script`), not with init containers: the kubelet starts each init
//! container only after its once-a-second relist has seen the previous one exit, which
//! cost every VM start a second. So the launcher starts while its images are being
//! copied and waits for each copier's `DIR.done` (or `DIR.failed`) before it opens them
//! ([`await_copies`]).
//!
//! A copier must then live exactly as long as the launcher: one that ended earlier would
//! make the pod NotReady (out of its Services), one that outlived it would keep the pod
//! Running after the guest. The launcher holds a FIFO open as a writer for its whole life
//! ([`hold`], before anything can fail); each copier reads it and ends at end-of-file,
//! when the kernel has closed the launcher's end, however the launcher ended. A copier
//! arriving after an orderly end sees the `ended` file [`Lifeline`] leaves on drop.
//!
//! The pod's other sidecar, the `guest-console-log` tail (`virt-tail`,
//! [`crate::console_log`]), ends with the launcher the same way: it holds the FIFO's
//! reading end ([`attach`]) and stops when it hangs up.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::volumes::ImageDirs;

/// Name of the file left beside the FIFO when the launcher ends in an orderly way.
const ENDED: &str = "ended";

/// How often the launcher looks for its copiers' results (a copy of a kernel and an
/// initrd takes a few milliseconds; big disks take seconds).
const POLL: Duration = Duration::from_millis(20);

/// After this long without a result, the wait is logged (once).
const SLOW: Duration = Duration::from_secs(10);

/// Why the lifeline or a copy failed.
#[derive(Debug, thiserror::Error)]
pub enum LifelineError {
    /// Creating or opening the FIFO failed.
    #[error("lifeline {path}: {source}")]
    Io {
        /// The FIFO.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// An image copier failed; its message names the file.
    #[error("copying the files of image {image} out of it failed: {message}")]
    CopyFailed {
        /// The image reference.
        image: String,
        /// The copier's error output.
        message: String,
    },
    /// Asked to stop while waiting.
    #[error("stopped while waiting for the image copies")]
    Stopped,
    /// No launcher created the FIFO in time.
    #[error("no launcher created its lifeline {path} within {waited:?}")]
    NoLauncher {
        /// The FIFO.
        path: PathBuf,
        /// How long the reader waited.
        waited: Duration,
    },
}

/// The FIFO the launcher holds open; on drop it leaves `ended` beside it and closes it.
#[derive(Debug)]
pub struct Lifeline {
    fifo: Option<File>,
    ended: PathBuf,
}

/// Creates the FIFO at `path` (if absent) and holds it open as a writer. Opened
/// read-write, which on Linux does not wait for a reader; close-on-exec, so that
/// nothing the launcher starts (libvirt, QEMU) keeps it open after the launcher.
pub fn hold(path: &Path) -> Result<Lifeline, LifelineError> {
    let io = |source| LifelineError::Io {
        path: path.to_path_buf(),
        source,
    };
    match nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o640)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(io(e.into())),
    }
    let fifo = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io)?;
    Ok(Lifeline {
        fifo: Some(fifo),
        ended: ended_path(path),
    })
}

/// The file an orderly end leaves beside the FIFO at `path`.
pub fn ended_path(path: &Path) -> PathBuf {
    path.with_file_name(ENDED)
}

/// [`hold`] at the path in `kubevirt_api::LAUNCHER_LIFELINE_ENV`, if the pod set it.
pub fn hold_from_env() -> Result<Option<Lifeline>, LifelineError> {
    std::env::var_os(kubevirt_api::LAUNCHER_LIFELINE_ENV)
        .map(|p| hold(Path::new(&p)))
        .transpose()
}

impl Drop for Lifeline {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(&self.ended, b"") {
            tracing::warn!(file = %self.ended.display(), error = %e, "writing the lifeline's end");
        }
        drop(self.fifo.take());
    }
}

/// How long a reader waits for the FIFO to appear: the launcher creates it first thing,
/// so only a launcher that never started (or failed at once) leaves a reader waiting.
pub const START_WAIT: Duration = Duration::from_secs(300);

/// How long a reader waits for the launcher to hold a FIFO that exists: only a launcher
/// killed between creating and opening it, or one killed before the reader came (no
/// `ended` then), leaves a FIFO without a writer.
pub const OPEN_WAIT: Duration = Duration::from_secs(30);

/// The launcher's life as a reader sees it.
#[derive(Debug)]
pub enum Attached {
    /// The FIFO's reading end, opened while the launcher held the other: it hangs up
    /// ([`Attached::hung_up`]) when the launcher ends.
    Held(File),
    /// The launcher had ended before the reader got there.
    Ended,
}

impl Attached {
    /// Whether the launcher has ended (waits up to `timeout` for it).
    pub fn hung_up(&self, timeout: Duration) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let Self::Held(f) = self else {
            return true;
        };
        let mut fds = [PollFd::new(f.as_fd(), PollFlags::POLLIN)];
        let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        matches!(poll(&mut fds, ms), Ok(n) if n > 0)
            && fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
    }
}

/// Attaches to the launcher's lifeline at `path` as a reader (the tail's side of what the
/// copiers' `cat` does). Blocks while the launcher has not created the FIFO (up to
/// `start_wait`, then [`LifelineError::NoLauncher`]) or not opened it (up to `open_wait`,
/// then taken as ended). The open itself blocks until the launcher holds the writing end
/// — that is what makes the later hang-up certain (a FIFO opened without a writer reports
/// none) — so it runs on a thread of its own, left behind if it never returns.
pub fn attach(
    path: &Path,
    start_wait: Duration,
    open_wait: Duration,
) -> Result<Attached, LifelineError> {
    let ended = ended_path(path);
    let start = Instant::now();
    loop {
        if ended.exists() {
            return Ok(Attached::Ended);
        }
        if std::fs::symlink_metadata(path).is_ok() {
            break;
        }
        if start.elapsed() > start_wait {
            return Err(LifelineError::NoLauncher {
                path: path.to_path_buf(),
                waited: start_wait,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.to_path_buf();
    std::thread::Builder::new()
        .name("lifeline-open".into())
        .spawn(move || {
            let _ = tx.send(File::open(&p));
        })
        .map_err(|source| LifelineError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let opening = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Ok(f)) => return Ok(Attached::Held(f)),
            Ok(Err(source)) => {
                return Err(LifelineError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            }
            Err(_) if ended.exists() || opening.elapsed() > open_wait => {
                return Ok(Attached::Ended);
            }
            Err(_) => {}
        }
    }
}

/// What a copier left for `dir`: `None` while it copies.
fn copy_result(dir: &Path) -> Option<Result<(), String>> {
    let with = |ext: &str| {
        let mut p = dir.as_os_str().to_os_string();
        p.push(ext);
        PathBuf::from(p)
    };
    if let Ok(message) = std::fs::read_to_string(with(".failed")) {
        return Some(Err(message.trim().to_string()));
    }
    with(".done").exists().then_some(Ok(()))
}

/// Waits until every image in `images` is copied, or one copy failed, or `shutdown`.
pub async fn await_copies(
    images: &ImageDirs,
    shutdown: &CancellationToken,
) -> Result<(), LifelineError> {
    let start = Instant::now();
    let mut pending: Vec<(&String, &PathBuf)> = images.0.iter().collect();
    let mut logged = false;
    loop {
        let mut still = Vec::with_capacity(pending.len());
        for (image, dir) in pending {
            match copy_result(dir) {
                Some(Ok(())) => {}
                Some(Err(message)) => {
                    return Err(LifelineError::CopyFailed {
                        image: image.clone(),
                        message,
                    });
                }
                None => still.push((image, dir)),
            }
        }
        pending = still;
        if pending.is_empty() {
            tracing::info!(
                elapsed_ms = start.elapsed().as_millis() as u64,
                "images copied"
            );
            return Ok(());
        }
        if !logged && start.elapsed() > SLOW {
            logged = true;
            let waiting: Vec<&str> = pending.iter().map(|(i, _)| i.as_str()).collect();
            tracing::info!(
                ?waiting,
                "still waiting for image copies (pulling the image?)"
            );
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Err(LifelineError::Stopped),
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Read;

    #[test]
    fn a_reader_sees_the_end_of_the_lifeline_when_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("launcher");
        let life = hold(&path).unwrap();
        // Opening for reading does not block: the launcher holds the writing end.
        let mut reader = File::open(&path).unwrap();
        let t = std::thread::spawn(move || {
            let mut buf = Vec::new();
            reader.read_to_end(&mut buf).unwrap();
            buf.len()
        });
        assert!(!dir.path().join(ENDED).exists());
        drop(life);
        assert_eq!(t.join().unwrap(), 0);
        assert!(dir.path().join(ENDED).exists());
        // A second hold (a restarted launcher) reuses the FIFO.
        drop(hold(&path).unwrap());
    }

    #[test]
    fn an_attached_reader_sees_the_launcher_end_however_it_ends() {
        let long = Duration::from_secs(10);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("launcher");
        // Attached before the launcher came: waits for it, then for its end.
        let p = path.clone();
        let early = std::thread::spawn(move || attach(&p, long, long).unwrap());
        std::thread::sleep(Duration::from_millis(150));
        let life = hold(&path).unwrap();
        let early = early.join().unwrap();
        assert!(matches!(early, Attached::Held(_)));
        assert!(!early.hung_up(Duration::ZERO));
        // The kernel closes the launcher's descriptor however it ends: no `ended` needed.
        let mut life = life;
        drop(life.fifo.take());
        assert!(early.hung_up(Duration::from_secs(1)));

        // After an orderly end: `ended`, at once.
        drop(life);
        let after = attach(&path, long, long).unwrap();
        assert!(matches!(after, Attached::Ended) && after.hung_up(Duration::ZERO));

        // A FIFO nobody holds and no `ended` (a launcher killed before the reader came):
        // taken as ended once the open wait is over.
        std::fs::remove_file(ended_path(&path)).unwrap();
        let t = Instant::now();
        let orphan = attach(&path, long, Duration::from_millis(300)).unwrap();
        assert!(matches!(orphan, Attached::Ended));
        assert!(t.elapsed() >= Duration::from_millis(300));
        // Releases the open left waiting on its thread.
        drop(std::fs::OpenOptions::new().write(true).open(&path).unwrap());

        // No FIFO at all: the launcher never started.
        let e = attach(&dir.path().join("none"), Duration::from_millis(200), long).unwrap_err();
        assert!(matches!(e, LifelineError::NoLauncher { .. }), "{e}");
    }

    #[tokio::test]
    async fn copies_are_awaited_and_a_failure_names_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let images = ImageDirs(BTreeMap::from([
            ("a:1".to_string(), dir.path().join("0")),
            ("b:2".to_string(), dir.path().join("1")),
        ]));
        let stop = CancellationToken::new();
        std::fs::write(dir.path().join("0.done"), b"").unwrap();
        let d = dir.path().to_path_buf();
        let later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            std::fs::write(d.join("1.done"), b"").unwrap();
        });
        await_copies(&images, &stop).await.unwrap();
        later.await.unwrap();

        std::fs::remove_file(dir.path().join("1.done")).unwrap();
        std::fs::write(
            dir.path().join("1.failed"),
            "/disk/x in the image is not a regular file\n",
        )
        .unwrap();
        let e = await_copies(&images, &stop).await.unwrap_err().to_string();
        assert_eq!(
            e,
            "copying the files of image b:2 out of it failed: \
             /disk/x in the image is not a regular file"
        );

        std::fs::remove_file(dir.path().join("1.failed")).unwrap();
        stop.cancel();
        assert!(matches!(
            await_copies(&images, &stop).await,
            Err(LifelineError::Stopped)
        ));
    }
}
