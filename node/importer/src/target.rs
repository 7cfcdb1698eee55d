//! Where the disk goes: a Filesystem claim's directory (`disk.img`, written as
//! `disk.img.importing` and renamed when complete, so a partial `disk.img` never exists) or a
//! block device (written in place). And the sparse writer both the target and the scratch
//! spool use.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};

use crate::result::ImportError;

/// The disk's file in a Filesystem claim (KubeVirt's name).
pub const DISK_IMG: &str = "disk.img";
/// The disk while it is being written.
pub const IMPORTING: &str = "disk.img.importing";

/// The resolved `--target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A Filesystem claim's mount: the result is `dir/disk.img` of `size` bytes.
    Filesystem { dir: PathBuf, size: u64 },
    /// A block device of which `size` bytes are used.
    Block { path: PathBuf, size: u64 },
}

impl Target {
    /// Looks at `path`: a directory or a block device. `size`: `--size`, required for a
    /// directory; for a device at most its size (the device's size when absent).
    pub fn resolve(path: &Path, size: Option<u64>) -> Result<Target, ImportError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| ImportError::InvalidArgument(format!("target {}: {e}", path.display())))?;
        if meta.is_dir() {
            let size = size.ok_or_else(|| {
                ImportError::InvalidArgument(format!(
                    "target {} is a directory (a Filesystem claim): --size is required",
                    path.display()
                ))
            })?;
            return Ok(Target::Filesystem {
                dir: path.to_path_buf(),
                size,
            });
        }
        if meta.file_type().is_block_device() {
            let dev = File::open(path).map_err(ImportError::write(path))?;
            let dev_size = device_size(&dev).map_err(ImportError::write(path))?;
            return Ok(Target::Block {
                path: path.to_path_buf(),
                size: size.map_or(dev_size, |s| s.min(dev_size)),
            });
        }
        Err(ImportError::InvalidArgument(format!(
            "target {} is neither a directory nor a block device",
            path.display()
        )))
    }

    /// Usable bytes.
    pub fn size(&self) -> u64 {
        match self {
            Target::Filesystem { size, .. } | Target::Block { size, .. } => *size,
        }
    }

    /// The file being written: `disk.img.importing` or the device.
    pub fn write_path(&self) -> PathBuf {
        match self {
            Target::Filesystem { dir, .. } => dir.join(IMPORTING),
            Target::Block { path, .. } => path.clone(),
        }
    }

    /// Removes what a killed attempt left: `disk.img.importing`.
    pub fn clean_leftovers(&self) -> Result<(), ImportError> {
        if let Target::Filesystem { dir, .. } = self {
            let p = dir.join(IMPORTING);
            match std::fs::remove_file(&p) {
                Ok(()) => {
                    tracing::info!(file = %p.display(), "removed a previous attempt's leftover")
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ImportError::Write { path: p, source: e }),
            }
        }
        Ok(())
    }

    /// Opens the destination for writing: a new, empty `disk.img.importing` of the target's
    /// size (sparse), or the device.
    pub fn open(&self) -> Result<File, ImportError> {
        let path = self.write_path();
        match self {
            Target::Filesystem { size, .. } => {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&path)
                    .map_err(ImportError::write(&path))?;
                f.set_len(*size).map_err(ImportError::write(&path))?;
                Ok(f)
            }
            Target::Block { .. } => OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(ImportError::write(&path)),
        }
    }

    /// Whether blocks of zeroes may be skipped: only in a new file (a device holds old data).
    pub fn sparse(&self) -> bool {
        matches!(self, Target::Filesystem { .. })
    }

    /// Makes the written data durable and, for a Filesystem target, the disk visible:
    /// `disk.img.importing` sized, fsynced, renamed to `disk.img`, the directory fsynced.
    pub fn commit(&self, file: &File) -> Result<(), ImportError> {
        let path = self.write_path();
        match self {
            Target::Filesystem { dir, size } => {
                file.set_len(*size).map_err(ImportError::write(&path))?;
                file.sync_all().map_err(ImportError::write(&path))?;
                let disk = dir.join(DISK_IMG);
                std::fs::rename(&path, &disk).map_err(ImportError::write(&disk))?;
                File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(ImportError::write(dir))?;
            }
            Target::Block { .. } => file.sync_all().map_err(ImportError::write(&path))?,
        }
        Ok(())
    }

    /// After a failure: no half-written `disk.img.importing` stays behind.
    pub fn abandon(&self) {
        if let Target::Filesystem { dir, .. } = self {
            let _ = std::fs::remove_file(dir.join(IMPORTING));
        }
    }
}

fn device_size(dev: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut d = dev;
    d.seek(SeekFrom::End(0))
}

/// The block size of zero detection: blocks of this many zero bytes are not written.
const BLOCK: usize = 4096;
/// Bytes gathered before a write.
const BUFFER: usize = 1 << 20;
/// `fdatasync` after this many written bytes: dirty page cache stays bounded (it counts
/// against the pod's memory limit on cgroup v1).
pub const SYNC_EVERY: u64 = 64 << 20;

/// Writes a stream at offset 0 of a file or device: zero blocks skipped (seeked over) when
/// `sparse`, written in 1 MiB pieces, `fdatasync` every [`SYNC_EVERY`]. Past `limit` it only
/// counts (the caller reports the total as too large).
#[derive(Debug)]
pub struct SparseWriter {
    file: File,
    path: PathBuf,
    sparse: bool,
    limit: Option<u64>,
    /// Bytes accepted (written, skipped or pending).
    len: u64,
    pending: Vec<u8>,
    /// Offset of `pending[0]`.
    pending_at: u64,
    unsynced: u64,
}

impl SparseWriter {
    pub fn new(file: File, path: PathBuf, sparse: bool, limit: Option<u64>) -> Self {
        SparseWriter {
            file,
            path,
            sparse,
            limit,
            len: 0,
            pending: Vec::with_capacity(BUFFER),
            pending_at: 0,
            unsynced: 0,
        }
    }

    /// Bytes accepted so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// More bytes than `limit` arrived.
    pub fn over_limit(&self) -> bool {
        self.limit.is_some_and(|l| self.len > l)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn write(&mut self, mut data: &[u8]) -> Result<(), ImportError> {
        if let Some(limit) = self.limit {
            let room = limit.saturating_sub(self.len);
            if (data.len() as u64) > room {
                // Only the part that fits is written; the rest is counted.
                let fits = room as usize;
                self.push(&data[..fits])?;
                self.len += (data.len() - fits) as u64;
                data = &[];
            }
        }
        self.push(data)
    }

    fn push(&mut self, mut data: &[u8]) -> Result<(), ImportError> {
        self.len += data.len() as u64;
        while !data.is_empty() {
            let n = (BUFFER - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.pending.len() == BUFFER {
                self.flush_pending()?;
            }
        }
        Ok(())
    }

    /// Writes `pending`: runs of non-zero blocks in one write each.
    fn flush_pending(&mut self) -> Result<(), ImportError> {
        let buf = std::mem::take(&mut self.pending);
        let mut i = 0;
        while i < buf.len() {
            let end = (i + BLOCK).min(buf.len());
            if self.sparse && is_zero(&buf[i..end]) {
                i = end;
                continue;
            }
            // A run of non-zero blocks.
            let mut run_end = end;
            while run_end < buf.len() {
                let next = (run_end + BLOCK).min(buf.len());
                if self.sparse && is_zero(&buf[run_end..next]) {
                    break;
                }
                run_end = next;
            }
            self.file
                .write_all_at(&buf[i..run_end], self.pending_at + i as u64)
                .map_err(ImportError::write(&self.path))?;
            self.unsynced += (run_end - i) as u64;
            i = run_end;
        }
        self.pending_at += buf.len() as u64;
        self.pending = buf;
        self.pending.clear();
        if self.unsynced >= SYNC_EVERY {
            self.file
                .sync_data()
                .map_err(ImportError::write(&self.path))?;
            self.unsynced = 0;
        }
        Ok(())
    }

    /// Moves on to `offset` over a hole of the source (a clone reads only the source's data):
    /// nothing is written into a sparse target, whose new file reads zeroes there; zeroes
    /// are written into a device, which holds old data. Never backwards.
    pub fn skip_to(&mut self, offset: u64) -> Result<(), ImportError> {
        if offset <= self.len {
            return Ok(());
        }
        if !self.sparse {
            let zeroes = vec![0u8; BUFFER];
            while self.len < offset {
                let n = usize::try_from(offset - self.len).map_or(BUFFER, |n| n.min(BUFFER));
                self.write(&zeroes[..n])?;
            }
            return Ok(());
        }
        self.flush_pending()?;
        self.pending_at = offset;
        self.len = offset;
        Ok(())
    }

    /// Writes what is pending; the file (not yet fsynced) for the caller to commit.
    pub fn finish(mut self) -> Result<File, ImportError> {
        self.flush_pending()?;
        Ok(self.file)
    }
}

fn is_zero(b: &[u8]) -> bool {
    // Compared in u64 words: the hot loop of a mostly empty image.
    let mut words = b.chunks_exact(8);
    words
        .by_ref()
        .all(|w| u64::from_ne_bytes(w.try_into().unwrap_or([1; 8])) == 0)
        && words.remainder().iter().all(|&x| x == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn writer(dir: &Path, sparse: bool, limit: Option<u64>) -> SparseWriter {
        let p = dir.join("f");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        SparseWriter::new(f, p, sparse, limit)
    }

    #[test]
    fn skips_zero_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(dir.path(), true, None);
        let mut data = vec![0u8; 8 << 20];
        data[5] = 1;
        data[(4 << 20) + 100] = 2;
        // Fed in odd pieces.
        for c in data.chunks(12_345) {
            w.write(c).unwrap();
        }
        assert_eq!(w.len(), 8 << 20);
        let f = w.finish().unwrap();
        f.set_len(8 << 20).unwrap();
        let back = std::fs::read(dir.path().join("f")).unwrap();
        assert_eq!(back, data);
        // Two 4 KiB blocks written, the rest holes.
        let meta = std::fs::metadata(dir.path().join("f")).unwrap();
        assert!(meta.blocks() * 512 <= 64 << 10, "{} blocks", meta.blocks());
    }

    #[test]
    fn dense_writes_everything() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(dir.path(), false, None);
        w.write(&[0u8; 10_000]).unwrap();
        w.finish().unwrap();
        let meta = std::fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!(meta.len(), 10_000);
        assert!(meta.blocks() > 0);
    }

    #[test]
    fn counts_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(dir.path(), true, Some(10));
        w.write(&[1u8; 8]).unwrap();
        assert!(!w.over_limit());
        w.write(&[1u8; 8]).unwrap();
        w.write(&[1u8; 8]).unwrap();
        assert!(w.over_limit());
        assert_eq!(w.len(), 24);
        w.finish().unwrap();
        // Nothing past the limit was written.
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), vec![1u8; 10]);
    }

    #[test]
    fn skipping_leaves_holes_in_a_sparse_file_and_zeroes_on_a_device() {
        for sparse in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("f");
            std::fs::write(&p, vec![9u8; 3 << 20]).unwrap();
            let f = OpenOptions::new().write(true).open(&p).unwrap();
            let mut w = SparseWriter::new(f, p.clone(), sparse, None);
            w.write(b"head").unwrap();
            w.skip_to(2 << 20).unwrap();
            w.write(b"tail").unwrap();
            // Backwards is ignored.
            w.skip_to(5).unwrap();
            assert_eq!(w.len(), (2 << 20) + 4);
            w.finish().unwrap();
            let back = std::fs::read(&p).unwrap();
            assert_eq!(&back[..4], b"head");
            assert_eq!(&back[2 << 20..(2 << 20) + 4], b"tail");
            // A sparse target is a new file: the old bytes stand for its holes here only
            // because the test wrote them; a device gets zeroes.
            let between = &back[4..2 << 20];
            if sparse {
                assert!(between.iter().all(|&b| b == 9));
            } else {
                assert!(between.iter().all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn zero_detection() {
        assert!(is_zero(&[0u8; 4096]));
        assert!(is_zero(&[0u8; 13]));
        let mut b = [0u8; 13];
        b[12] = 1;
        assert!(!is_zero(&b));
        b[12] = 0;
        b[3] = 1;
        assert!(!is_zero(&b));
    }

    #[test]
    fn filesystem_target_commits_atomically() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(IMPORTING), b"old attempt").unwrap();
        let t = Target::resolve(dir.path(), Some(1 << 20)).unwrap();
        t.clean_leftovers().unwrap();
        assert!(!dir.path().join(IMPORTING).exists());
        let f = t.open().unwrap();
        assert!(!dir.path().join(DISK_IMG).exists());
        t.commit(&f).unwrap();
        assert!(!dir.path().join(IMPORTING).exists());
        assert_eq!(
            std::fs::metadata(dir.path().join(DISK_IMG)).unwrap().len(),
            1 << 20
        );
        assert_eq!(
            Target::resolve(dir.path(), None).unwrap_err().reason(),
            "InvalidArgument"
        );
        assert_eq!(
            Target::resolve(&dir.path().join(DISK_IMG), Some(1))
                .unwrap_err()
                .reason(),
            "InvalidArgument"
        );
    }
}
