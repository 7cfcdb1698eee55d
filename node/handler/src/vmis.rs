//! What this node knows of its VMIs, shared by the cluster loop, the HTTPS server and the
//! network set-up: where each launcher's sockets are, and which VMI (namespace/name) has
//! which uid here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

/// Where a node's launchers put their sockets.
#[derive(Clone, Debug)]
pub struct Paths {
    /// `/var/run/kubevirt-rs` on the host.
    pub run_root: PathBuf,
}

impl Paths {
    /// `<root>/sockets`.
    pub fn sockets(&self) -> PathBuf {
        self.run_root.join("sockets")
    }
    /// `<root>/sockets/<uid>`.
    pub fn dir(&self, uid: &str) -> PathBuf {
        self.sockets().join(uid)
    }
    /// The launcher's command socket.
    pub fn cmd(&self, uid: &str) -> PathBuf {
        self.dir(uid).join("cmd.sock")
    }
    /// The serial console socket (bound by QEMU).
    pub fn console(&self, uid: &str) -> PathBuf {
        self.dir(uid).join("console.sock")
    }
    /// The VNC socket (bound by QEMU).
    pub fn vnc(&self, uid: &str) -> PathBuf {
        self.dir(uid).join("vnc.sock")
    }
}

/// The VMIs of this node by namespace and name, for the HTTPS server.
#[derive(Clone, Debug, Default)]
pub struct Registry(Arc<RwLock<BTreeMap<(String, String), String>>>);

impl Registry {
    /// The uid of VMI `ns/name` if it is on this node.
    pub fn uid(&self, ns: &str, name: &str) -> Option<String> {
        self.0
            .read()
            .ok()
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())).cloned())
    }

    pub(crate) fn insert(&self, ns: String, name: String, uid: String) {
        if let Ok(mut m) = self.0.write() {
            m.insert((ns, name), uid);
        }
    }

    /// Forgets `ns/name` if it still means `uid`: a VMI re-created under the same name
    /// (new uid) may already have replaced it.
    pub(crate) fn remove(&self, ns: &str, name: &str, uid: &str) {
        if let Ok(mut m) = self.0.write() {
            let key = (ns.to_string(), name.to_string());
            if m.get(&key).is_some_and(|u| u == uid) {
                m.remove(&key);
            }
        }
    }
}
