//! Carries out [`crate::cdi`]'s decision against the API (the APIServices of CDI's groups),
//! and keeps what virtctl image-upload needs: CDIConfig `config` and the upload token key.
//! Kept out of cdi.rs so that the decision there stays pure and table-tested.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch};

use crate::ctx::{Error, pp};
use crate::render::{self, NAMESPACE};
use crate::{cdi, kubevirt};

/// Whether a real CDI is installed, and what that means for the APIServices of CDI's groups
/// (crate::cdi), read once per reconcile.
#[derive(Debug)]
pub(crate) struct CdiState {
    /// CDI's DataVolume CRD exists.
    pub(crate) installed: bool,
    /// Each APIService of CDI's groups that virt-apiserver serves: its step, and the uid of
    /// the one there now.
    pub(crate) steps: BTreeMap<String, (cdi::ApiServiceStep, Option<String>)>,
}

impl CdiState {
    /// Whether the APIService `name` is applied (every one outside CDI's groups is).
    pub(crate) fn applies(&self, name: &str) -> bool {
        self.steps
            .get(name)
            .is_none_or(|(s, _)| *s == cdi::ApiServiceStep::Apply)
    }

    /// The names of the APIServices virt-apiserver serves on this cluster: those applied.
    pub(crate) fn served(&self) -> Vec<String> {
        render::api_services()
            .into_iter()
            .map(|(g, v)| render::api_service_name(g, v))
            .filter(|n| self.applies(n))
            .collect()
    }

    /// What the DataVolume controller and the status follow.
    pub(crate) fn plan(&self) -> cdi::Plan {
        cdi::decide(self.installed, None)
    }
}

pub(crate) async fn cdi_state(client: &Client) -> Result<CdiState, kube::Error> {
    let installed = crate::kubevirt::crd_exists(client, cdi::DATAVOLUME_CRD).await?;
    let apis: Api<APIService> = Api::all(client.clone());
    let mut steps = BTreeMap::new();
    for (group, version) in render::api_services() {
        if !cdi::is_cdi_group(group) {
            continue;
        }
        let name = render::api_service_name(group, version);
        let existing = apis.get_opt(&name).await?;
        let step = cdi::decide(installed, existing.as_ref()).apiservice;
        steps.insert(name, (step, existing.and_then(|a| a.metadata.uid)));
    }
    Ok(CdiState { installed, steps })
}

/// Deletes the installation's own APIServices of CDI's groups once CDI is installed
/// ([`cdi::ApiServiceStep::DeleteOurs`]; exactly the object judged ours, by uid):
/// kube-apiserver then makes its local one for CDI's CRD.
pub(crate) async fn remove_cdi_apiservices(
    client: &Client,
    coexist: &CdiState,
) -> Result<(), Error> {
    let apis: Api<APIService> = Api::all(client.clone());
    for (name, (step, uid)) in &coexist.steps {
        if *step != cdi::ApiServiceStep::DeleteOurs {
            continue;
        }
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match apis.delete(name, &dp).await {
            Ok(_) => tracing::info!(
                apiservice = %name,
                crd = cdi::DATAVOLUME_CRD,
                "CDI is installed: deleted our APIService, kube-apiserver serves CDI's DataVolumes"
            ),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Creates CDIConfig `config` if it is missing (its spec is the administrator's) and writes
/// its status: the upload proxy's URL and the CA its certificate chains to.
pub(crate) async fn cdi_config(client: &Client, ca: &str) -> Result<(), Error> {
    let k = &kubevirt_api::kinds::cdi_config::KIND;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &kubevirt::workload_resource(k));
    let name = kubevirt_api::cdi::config::NAME;
    if api.get_opt(name).await?.is_none() {
        let obj = serde_json::json!({"apiVersion": k.api_version(), "kind": k.kind,
            "metadata": {"name": name}, "spec": {}});
        let obj: DynamicObject =
            serde_json::from_value(obj).map_err(|e| Error::Other(e.to_string()))?;
        match api.create(&kube::api::PostParams::default(), &obj).await {
            Ok(_) => tracing::info!("created CDIConfig config"),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let status = serde_json::json!({"apiVersion": k.api_version(), "kind": k.kind,
        "metadata": {"name": name},
        "status": {"uploadProxyURL": render::upload_proxy_url(), "uploadProxyCA": ca}});
    api.patch_status(name, &pp(), &Patch::Apply(&status))
        .await?;
    Ok(())
}

/// Makes the Secret of the upload-token key once: random bytes every virt-apiserver
/// replica signs and verifies upload tokens with. Never rewritten (a new key would void the
/// tokens in flight); deleting the Secret makes a new key at the next reconcile.
pub(crate) async fn upload_token_key(client: &Client) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    if secrets
        .get_opt(render::UPLOAD_TOKEN_SECRET)
        .await?
        .is_some()
    {
        return Ok(());
    }
    let key = kubevirt_api::cdi::upload::random_key_bytes()
        .map_err(|_| Error::Other("no random bytes for the upload token key".into()))?;
    let secret = Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(render::UPLOAD_TOKEN_SECRET.into()),
            namespace: Some(NAMESPACE.into()),
            labels: Some(render::part_of_labels(render::UPLOAD_TOKEN_SECRET)),
            ..Default::default()
        },
        data: Some(std::collections::BTreeMap::from([(
            render::UPLOAD_TOKEN_KEY.to_string(),
            k8s_openapi::ByteString(key.to_vec()),
        )])),
        ..Secret::default()
    };
    match secrets
        .create(&kube::api::PostParams::default(), &secret)
        .await
    {
        Ok(_) => {
            tracing::info!(
                secret = render::UPLOAD_TOKEN_SECRET,
                "made the upload token key"
            );
            Ok(())
        }
        // Another operator replica made it first.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
