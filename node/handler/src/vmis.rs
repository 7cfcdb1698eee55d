//! What this node knows of its VMIs, shared by the cluster loop, the HTTPS server and the
//! network set-up: where each launcher's sockets are, and which VMI (namespace/name) has
//! which launcher here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use kubevirt_api::VirtualMachineInstance;

use crate::launcher_fs::{LauncherDir, Location, SocketsDir};

/// How this handler reaches its launchers' sockets.
#[derive(Clone, Debug)]
pub enum Paths {
    /// Launcher pods on this node, through `/proc/<pid>/root` of their compute container
    /// (the DaemonSet: launcher pods keep their sockets in an emptyDir).
    Pods {
        /// The host's procfs (`/proc`; the handler runs in the host pid namespace).
        proc: PathBuf,
    },
    /// `<run_root>/sockets/<dir>` on this host: launchers started beside the handler
    /// (the launcher crate's integration tests).
    Host {
        /// The directory holding `sockets/`.
        run_root: PathBuf,
    },
}

impl Paths {
    /// The launcher of VMI `uid` on `node` (the VMI's current launcher there: a
    /// migration's target once it completed): the key naming it in [`Self::launcher`].
    /// `None` while the VMI does not say yet (its pod's node is recorded at launch).
    pub fn launcher_key(
        &self,
        uid: &str,
        vmi: &VirtualMachineInstance,
        node: &str,
    ) -> Option<String> {
        match self {
            Self::Pods { .. } => pod_on(vmi, node),
            Self::Host { .. } => Some(crate::cluster_migration::launcher_dir_name(uid, vmi, node)),
        }
    }

    /// The target launcher of migration `migration` of VMI `uid` on `node`.
    pub fn target_key(
        &self,
        uid: &str,
        vmi: &VirtualMachineInstance,
        migration: &str,
        node: &str,
    ) -> Option<String> {
        match self {
            Self::Pods { .. } => pod_on(vmi, node),
            Self::Host { .. } => Some(crate::migration::target_socket_dir(uid, migration)),
        }
    }

    /// Opens the directories of the launchers `keys` name that can be found now (one pass
    /// over /proc for all of them); blocking.
    pub fn open_launchers(&self, keys: &[String]) -> Vec<(String, SocketsDir)> {
        match self {
            Self::Pods { proc } => SocketsDir::open_pods(proc, keys),
            Self::Host { run_root } => keys
                .iter()
                .filter_map(|k| {
                    Some((
                        k.clone(),
                        SocketsDir::at(&run_root.join("sockets").join(k)).ok()?,
                    ))
                })
                .collect(),
        }
    }

    /// The sockets directory of the launcher `key` names.
    pub fn launcher(&self, key: &str) -> LauncherDir {
        LauncherDir::new(match self {
            Self::Pods { proc } => Location::Pod {
                proc: proc.clone(),
                uid: key.to_string(),
            },
            Self::Host { run_root } => Location::Host(run_root.join("sockets").join(key)),
        })
    }
}

/// The launcher pod of `vmi` on `node`, from `status.activePods` (written by
/// virt-controller only: a pod of the user's claiming to be a launcher is never taken).
fn pod_on(vmi: &VirtualMachineInstance, node: &str) -> Option<String> {
    vmi.status
        .as_ref()?
        .active_pods
        .as_ref()?
        .iter()
        .find(|(_, n)| n.as_str() == node)
        .map(|(pod, _)| pod.clone())
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
