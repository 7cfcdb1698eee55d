//! Values built from certificate files that change under a running process.
//!
//! Kubernetes updates a mounted Secret in place (a new directory behind the `..data`
//! symlink) when the operator rotates a certificate. Restarting a server to pick the new
//! files up would cut every open console and VNC stream, so servers and clients keep a
//! [`Reloading`] value instead and ask it for the current one whenever they start a new
//! connection: established connections keep the certificate they were made with, new ones
//! get the new certificate. Files that do not build (a half-applied update) leave the
//! previous value in place.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// What a builder may fail with.
pub type BuildError = Box<dyn std::error::Error + Send + Sync>;

type Builder<T> = Box<dyn Fn(&[Vec<u8>]) -> Result<T, BuildError> + Send + Sync>;

/// The first load failed (later failures keep the previous value and are logged by the
/// caller through [`Reloading::last_error`]).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// A file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The files were read but do not make a value.
    #[error("{what}: {source}")]
    Build {
        what: String,
        #[source]
        source: BuildError,
    },
}

/// Identity of a file's current version: a Secret update is a new file (new inode) even
/// when size and modification time happen to match the old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mtime: i64,
    mtime_nsec: i64,
    len: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        mtime: m.mtime(),
        mtime_nsec: m.mtime_nsec(),
        len: m.len(),
    })
}

struct State<T> {
    stamps: Vec<Option<Stamp>>,
    value: Arc<T>,
    last_error: Option<String>,
}

/// A value built from files, rebuilt when they change (see the module docs).
pub struct Reloading<T> {
    what: String,
    paths: Vec<PathBuf>,
    build: Option<Builder<T>>,
    state: Mutex<State<T>>,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.what)
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl<T> Reloading<T> {
    /// Builds the value from `paths` (read in that order) now, and again whenever one of
    /// them changes. `what` names the value in errors.
    pub fn new<F>(what: &str, paths: Vec<PathBuf>, build: F) -> Result<Self, ReloadError>
    where
        F: Fn(&[Vec<u8>]) -> Result<T, BuildError> + Send + Sync + 'static,
    {
        let stamps = paths.iter().map(|p| stamp(p)).collect();
        let contents = read_all(&paths)?;
        let value = build(&contents).map_err(|source| ReloadError::Build {
            what: what.to_string(),
            source,
        })?;
        Ok(Self {
            what: what.to_string(),
            paths,
            build: Some(Box::new(build)),
            state: Mutex::new(State {
                stamps,
                value: Arc::new(value),
                last_error: None,
            }),
        })
    }

    /// A value that never changes (tests, or material given inline).
    pub fn fixed(what: &str, value: T) -> Self {
        Self {
            what: what.to_string(),
            paths: Vec::new(),
            build: None,
            state: Mutex::new(State {
                stamps: Vec::new(),
                value: Arc::new(value),
                last_error: None,
            }),
        }
    }

    /// The current value: rebuilt first if a file changed since the last call. The same
    /// `Arc` is returned while nothing changed, so callers can tell a new value by
    /// `Arc::ptr_eq`. A few `stat` calls per use; meant for once per new connection.
    pub fn get(&self) -> Arc<T> {
        // A panic in a builder cannot leave a half-updated state: each field is replaced
        // whole, so a poisoned lock is still consistent.
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(build) = &self.build else {
            return st.value.clone();
        };
        let stamps: Vec<Option<Stamp>> = self.paths.iter().map(|p| stamp(p)).collect();
        if stamps != st.stamps {
            let built = read_all(&self.paths)
                .map_err(|e| e.to_string())
                .and_then(|c| build(&c).map_err(|e| e.to_string()));
            match built {
                Ok(v) => {
                    st.value = Arc::new(v);
                    st.last_error = None;
                    st.stamps = stamps;
                }
                Err(e) => {
                    // Stamps stay old: the next call tries again, which is what finishes a
                    // Secret update that was caught half way.
                    st.last_error = Some(format!("{}: {e}", self.what));
                }
            }
        }
        st.value.clone()
    }

    /// Why the files, changed since the value in use was built, could not be used; `None`
    /// once they could.
    pub fn last_error(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_error
            .clone()
    }
}

fn read_all(paths: &[PathBuf]) -> Result<Vec<Vec<u8>>, ReloadError> {
    paths
        .iter()
        .map(|p| {
            std::fs::read(p).map_err(|source| ReloadError::Read {
                path: p.clone(),
                source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(c: &[Vec<u8>]) -> Result<String, BuildError> {
        let s = String::from_utf8(c[0].clone())?;
        if s.is_empty() {
            return Err("empty".into());
        }
        Ok(s)
    }

    /// Replaces `path` the way kubelet does: a new file renamed over the old one.
    fn swap(path: &Path, contents: &str) {
        let tmp = path.with_extension("new");
        std::fs::write(&tmp, contents).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn rebuilds_on_change_and_keeps_the_value_while_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tls.crt");
        std::fs::write(&f, "one").unwrap();
        let r = Reloading::new("test", vec![f.clone()], parse).unwrap();
        let a = r.get();
        assert_eq!(*a, "one");
        assert!(Arc::ptr_eq(&a, &r.get()), "unchanged files: same value");
        swap(&f, "two");
        assert_eq!(*r.get(), "two");
        assert!(r.last_error().is_none());
    }

    #[test]
    fn unusable_new_files_keep_the_previous_value_until_fixed() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tls.crt");
        std::fs::write(&f, "one").unwrap();
        let r = Reloading::new("serving certificate", vec![f.clone()], parse).unwrap();
        swap(&f, "");
        assert_eq!(*r.get(), "one");
        assert!(
            r.last_error()
                .unwrap()
                .contains("serving certificate: empty")
        );
        std::fs::remove_file(&f).unwrap();
        assert_eq!(*r.get(), "one", "a missing file keeps the old value too");
        swap(&f, "three");
        assert_eq!(*r.get(), "three");
        assert!(r.last_error().is_none());
    }

    #[test]
    fn first_load_errors_name_the_file_or_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent.crt");
        let e = Reloading::new("x", vec![missing], parse).unwrap_err();
        assert!(e.to_string().contains("absent.crt"), "{e}");
        let f = dir.path().join("empty.crt");
        std::fs::write(&f, "").unwrap();
        let e = Reloading::new("client CA", vec![f], parse).unwrap_err();
        assert_eq!(e.to_string(), "client CA: empty");
    }

    #[test]
    fn fixed_values_never_change() {
        let r = Reloading::fixed("x", 7);
        assert!(Arc::ptr_eq(&r.get(), &r.get()));
    }
}
