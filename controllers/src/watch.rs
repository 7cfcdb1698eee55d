//! Controllers whose watches of our API re-list on their own ([`virt_watch`]): a
//! `kube::runtime::Controller` built on kube-runtime's own watcher would retry a
//! failing resourceVersion forever and stop seeing VMs, VMIs or migrations.

use std::fmt::Debug;

use futures::Stream;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use virt_watch::WatchMetrics;

/// A controller of every `K` in `api`, its watch labelled `name` in logs and metrics.
pub fn controller<K>(api: Api<K>, name: &'static str, metrics: &WatchMetrics) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    selected_controller(api, watcher::Config::default(), name, metrics)
}

/// [`controller`] over the objects `config` selects.
pub fn selected_controller<K>(
    api: Api<K>,
    config: watcher::Config,
    name: &'static str,
    metrics: &WatchMetrics,
) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer): (Store<K>, _) = reflector::store();
    let events = virt_watch::watch(api, config, name, metrics.clone());
    Controller::for_stream(
        reflector::reflector(writer, events).applied_objects(),
        reader,
    )
}

/// The objects of `api` selected by `config` as they change (for `owns_stream` and
/// `watches_stream`), with the same recovery.
pub fn objects<K>(
    api: Api<K>,
    config: watcher::Config,
    name: &'static str,
    metrics: &WatchMetrics,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    virt_watch::watch(api, config, name, metrics.clone()).touched_objects()
}
