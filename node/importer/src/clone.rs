//! `virt-importer clone`: one claim's disk copied into another (CDI's `pvc` source within a
//! namespace). The worker pod mounts the source claim read-only and the target claim; the
//! copy is the source's bytes as they are (a claim's `disk.img` is raw), written like an
//! import: sparse, `disk.img.importing` renamed to `disk.img` once complete and durable,
//! the target's `disk.img` of the target's usable size.
//!
//! Only the source's data extents are read (`SEEK_DATA`/`SEEK_HOLE`), so a mostly empty
//! 10 GiB disk costs what it holds, not 10 GiB of reads of zeroes; zero blocks inside data
//! extents are skipped too. Blocking file I/O throughout: the command runs on the main
//! thread, no async runtime.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
use nix::unistd::{Whence, lseek};

use crate::progress::Progress;
use crate::result::{ImportError, human};
use crate::target::{DISK_IMG, SYNC_EVERY, SparseWriter, Target};

/// What to clone, from the command line.
#[derive(Debug, Clone, Default)]
pub struct CloneConfig {
    /// The source claim's mount directory (its `disk.img`) or block device.
    pub source: PathBuf,
    /// The target claim's mount directory (`disk.img` in it) or block device.
    pub target: PathBuf,
    /// Usable bytes of the target: the size of its `disk.img` (required for a directory).
    pub size: Option<u64>,
}

/// A completed clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneOutcome {
    /// The file or device read.
    pub source: PathBuf,
    /// The file or device written; None when the source held no disk (a blank one).
    pub written: Option<PathBuf>,
    /// The source disk's size.
    pub source_size: u64,
    /// Bytes of the source that hold data (read and, unless all zero, written).
    pub data: u64,
    /// The target's usable size.
    pub target_size: u64,
}

impl CloneOutcome {
    /// For the termination message and the log.
    pub fn message(&self) -> String {
        match &self.written {
            Some(w) => format!(
                "cloned {} ({} bytes, {} of them data) into {}: image {} of {}",
                self.source.display(),
                self.source_size,
                self.data,
                w.display(),
                human(self.source_size),
                human(self.target_size)
            ),
            None => format!(
                "{} holds no {DISK_IMG} (a blank disk, made on first use): the clone is blank too",
                self.source.display()
            ),
        }
    }
}

/// Where the source disk is.
#[derive(Debug)]
enum Source {
    /// A Filesystem claim's `disk.img`.
    File(PathBuf),
    /// A Block claim's device.
    Device(PathBuf),
    /// A Filesystem claim without `disk.img`: a blank disk nobody has used yet (the launcher
    /// makes it sparse on first use).
    Blank(PathBuf),
}

fn resolve_source(path: &Path) -> Result<Source, ImportError> {
    let meta = std::fs::metadata(path).map_err(|e| ImportError::SourceNotFound {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    if meta.file_type().is_block_device() {
        return Ok(Source::Device(path.to_path_buf()));
    }
    if !meta.is_dir() {
        return Err(ImportError::InvalidArgument(format!(
            "source {} is neither a directory nor a block device",
            path.display()
        )));
    }
    let disk = path.join(DISK_IMG);
    match std::fs::metadata(&disk) {
        Ok(m) if m.is_file() => Ok(Source::File(disk)),
        Ok(_) => Err(ImportError::SourceNotFound {
            path: disk,
            detail: "not a regular file".into(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Source::Blank(path.to_path_buf())),
        Err(e) => Err(ImportError::Read {
            path: disk,
            source: e,
        }),
    }
}

/// Bytes read and written at a time.
const CHUNK: usize = 1 << 20;

/// Copies the source disk into the target. On failure nothing is left in a Filesystem
/// target but what was there before.
pub fn clone(cfg: &CloneConfig, progress: &mut Progress) -> Result<CloneOutcome, ImportError> {
    let target = Target::resolve(&cfg.target, cfg.size)?;
    target.clean_leftovers()?;
    let result = run(cfg, &target, progress);
    if result.is_err() {
        target.abandon();
    }
    progress.finish(result.is_ok());
    result
}

fn run(
    cfg: &CloneConfig,
    target: &Target,
    progress: &mut Progress,
) -> Result<CloneOutcome, ImportError> {
    let path = match resolve_source(&cfg.source)? {
        Source::File(p) | Source::Device(p) => p,
        Source::Blank(dir) => {
            tracing::info!(source = %dir.display(), "the source holds no disk image: nothing to copy");
            return Ok(CloneOutcome {
                source: dir,
                written: None,
                source_size: 0,
                data: 0,
                target_size: target.size(),
            });
        }
    };
    let src = File::open(&path).map_err(|source| ImportError::Read {
        path: path.clone(),
        source,
    })?;
    let len = {
        use std::io::{Seek, SeekFrom};
        let mut s = &src;
        s.seek(SeekFrom::End(0))
            .map_err(|source| ImportError::Read {
                path: path.clone(),
                source,
            })?
    };
    let usable = target.size();
    if len > usable {
        return Err(ImportError::TooLarge {
            image: len,
            usable,
            at_least: false,
        });
    }
    tracing::info!(source = %path.display(), target = %cfg.target.display(), size = len, usable, "cloning");
    progress.copying(len);
    let file = target.open()?;
    let mut writer = SparseWriter::new(file, target.write_path(), target.sparse(), Some(usable));
    let mut buf = vec![0u8; CHUNK];
    let mut data = 0u64;
    let mut unadvised = 0u64;
    let mut pos = 0u64;
    while pos < len {
        let (start, end) = next_extent(&src, pos, len);
        // The hole before it: nothing to read.
        writer.skip_to(start)?;
        progress.received(start - pos);
        let mut at = start;
        while at < end {
            let n = usize::try_from((end - at).min(CHUNK as u64)).unwrap_or(CHUNK);
            src.read_exact_at(&mut buf[..n], at)
                .map_err(|source| ImportError::Read {
                    path: path.clone(),
                    source,
                })?;
            writer.write(&buf[..n])?;
            at += n as u64;
            data += n as u64;
            unadvised += n as u64;
            progress.received(n as u64);
            if unadvised >= SYNC_EVERY {
                // What was read is not read again: the page cache it fills counts against
                // the pod's memory limit (cgroup v1), so it is let go as the copy goes.
                forget_cached(&src, at - unadvised, unadvised);
                unadvised = 0;
            }
        }
        pos = end;
    }
    writer.skip_to(len)?;
    let file = writer.finish()?;
    target.commit(&file)?;
    let written = match target {
        Target::Filesystem { dir, .. } => dir.join(DISK_IMG),
        Target::Block { path, .. } => path.clone(),
    };
    Ok(CloneOutcome {
        source: path,
        written: Some(written),
        source_size: len,
        data,
        target_size: usable,
    })
}

/// The next data extent `[start, end)` of `src` at or after `pos` (`start == end == len`
/// when only a hole is left). Where the file system or device cannot say (`SEEK_DATA`
/// unsupported), all of the rest is data.
fn next_extent(src: &File, pos: u64, len: u64) -> (u64, u64) {
    use nix::errno::Errno;
    let fd = src.as_raw_fd();
    let seek = |offset: u64, whence| -> Result<u64, Errno> {
        let offset = i64::try_from(offset).map_err(|_| Errno::EOVERFLOW)?;
        lseek(fd, offset, whence).map(|r| u64::try_from(r).unwrap_or(len))
    };
    match seek(pos, Whence::SeekData) {
        Ok(start) => {
            let start = start.min(len);
            let end = seek(start, Whence::SeekHole).unwrap_or(len).min(len);
            (start, end.max(start))
        }
        // No data past `pos`.
        Err(Errno::ENXIO) => (len, len),
        Err(_) => (pos, len),
    }
}

fn forget_cached(src: &File, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    if let Err(e) = posix_fadvise(
        src.as_raw_fd(),
        offset,
        len,
        PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    ) {
        // Only memory pressure: the copy goes on.
        tracing::debug!(error = %e, "posix_fadvise(DONTNEED) on the source");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::MetadataExt;

    use super::*;

    /// A sparse `disk.img` of `len` bytes with `pieces` written at their offsets.
    fn source(dir: &Path, len: u64, pieces: &[(u64, &[u8])]) -> Vec<u8> {
        let f = File::create(dir.join(DISK_IMG)).unwrap();
        f.set_len(len).unwrap();
        let mut want = vec![0u8; usize::try_from(len).unwrap()];
        for (at, bytes) in pieces {
            f.write_all_at(bytes, *at).unwrap();
            let at = usize::try_from(*at).unwrap();
            want[at..at + bytes.len()].copy_from_slice(bytes);
        }
        want
    }

    fn dirs() -> (tempfile::TempDir, tempfile::TempDir) {
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap())
    }

    #[test]
    fn copies_the_disk_exactly_sparse_and_grown_to_the_target_size() {
        let (src, dst) = dirs();
        let len = 64 << 20;
        let marker = b"kubevirt-rs-cloned-42";
        // Data at the start, in the middle (with a zero block inside the written run) and in
        // the last block; holes between.
        let mut middle = vec![7u8; 3 * 4096];
        middle[4096..8192].fill(0);
        let want = source(
            src.path(),
            len,
            &[(0, marker), (20 << 20, &middle), (len - 10, b"last bytes")],
        );
        let size = 80 << 20;
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut progress = Progress::new(Some(file.path().to_path_buf()));
        let out = clone(
            &CloneConfig {
                source: src.path().into(),
                target: dst.path().into(),
                size: Some(size),
            },
            &mut progress,
        )
        .unwrap();
        let disk = dst.path().join(DISK_IMG);
        assert_eq!(out.written.as_deref(), Some(disk.as_path()));
        assert_eq!(out.source_size, len);
        assert!(out.message().contains("into"), "{}", out.message());
        let meta = std::fs::metadata(&disk).unwrap();
        assert_eq!(meta.len(), size, "disk.img gets the target's usable size");
        let back = std::fs::read(&disk).unwrap();
        assert_eq!(
            &back[..want.len()],
            &want[..],
            "the source's bytes, exactly"
        );
        assert!(
            back[want.len()..].iter().all(|&b| b == 0),
            "zeroes past the source"
        );
        // Sparse: only the blocks with data were written (a few 4 KiB blocks, not 64 MiB).
        assert!(meta.blocks() * 512 <= 256 << 10, "{} blocks", meta.blocks());
        assert!(!dst.path().join(crate::target::IMPORTING).exists());
        // Holes were not read: far less than the whole disk counted as data.
        assert!(out.data < len / 2, "{} bytes read as data", out.data);
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(file.path()).unwrap()).unwrap();
        assert_eq!(report["phase"], "Completed");
        assert_eq!(report["progress"], 100.0);
        // The source is untouched.
        assert_eq!(std::fs::read(src.path().join(DISK_IMG)).unwrap(), want);
    }

    #[test]
    fn a_fully_written_source_is_copied_whole() {
        let (src, dst) = dirs();
        let data: Vec<u8> = (0..(3 << 20) + 123).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(src.path().join(DISK_IMG), &data).unwrap();
        let out = clone(
            &CloneConfig {
                source: src.path().into(),
                target: dst.path().into(),
                size: Some(4 << 20),
            },
            &mut Progress::new(None),
        )
        .unwrap();
        assert_eq!(out.data, data.len() as u64);
        let back = std::fs::read(dst.path().join(DISK_IMG)).unwrap();
        assert_eq!(back.len(), 4 << 20);
        assert_eq!(&back[..data.len()], &data[..]);
    }

    #[test]
    fn a_source_larger_than_the_target_fails_and_leaves_nothing() {
        let (src, dst) = dirs();
        source(src.path(), 8 << 20, &[(0, b"x")]);
        // A previous attempt's leftover goes too.
        std::fs::write(dst.path().join(crate::target::IMPORTING), b"old").unwrap();
        let e = clone(
            &CloneConfig {
                source: src.path().into(),
                target: dst.path().into(),
                size: Some(4 << 20),
            },
            &mut Progress::new(None),
        )
        .unwrap_err();
        assert_eq!(e.reason(), "ImageTooLarge");
        assert!(e.to_string().contains("8388608"), "{e}");
        assert!(std::fs::read_dir(dst.path()).unwrap().next().is_none());
    }

    #[test]
    fn a_blank_source_gives_a_blank_clone() {
        let (src, dst) = dirs();
        let out = clone(
            &CloneConfig {
                source: src.path().into(),
                target: dst.path().into(),
                size: Some(1 << 20),
            },
            &mut Progress::new(None),
        )
        .unwrap();
        assert_eq!(out.written, None);
        assert!(out.message().contains("blank"), "{}", out.message());
        assert!(!dst.path().join(DISK_IMG).exists());
    }

    #[test]
    fn a_missing_source_or_bad_arguments_are_typed() {
        let (src, dst) = dirs();
        let e = clone(
            &CloneConfig {
                source: src.path().join("nowhere"),
                target: dst.path().into(),
                size: Some(1 << 20),
            },
            &mut Progress::new(None),
        )
        .unwrap_err();
        assert_eq!(e.reason(), "SourceNotFound");
        let e = clone(
            &CloneConfig {
                source: src.path().into(),
                target: dst.path().into(),
                size: None,
            },
            &mut Progress::new(None),
        )
        .unwrap_err();
        assert_eq!(e.reason(), "InvalidArgument");
    }
}
