//! `POST /apis/upload.cdi.kubevirt.io/v1beta1/namespaces/{ns}/uploadtokenrequests`: CDI's
//! UploadTokenRequest, answered with a signed token and stored nowhere (as kube-apiserver's
//! TokenReview). The request chain has authorized `create uploadtokenrequests` in the
//! namespace already; here the request is decoded and validated like any object, the claim
//! is checked to take uploads (when kube-apiserver is reachable), and the token is signed
//! with the key the upload proxy verifies (docs/design-datavolumes.md 3.5).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kubevirt_api::cdi::annotations::UPLOAD_TARGET;
use kubevirt_api::cdi::upload::{TokenKey, UploadTokenRequest, UploadTokenRequestStatus};
use kubevirt_api::validation::FieldError;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::kinds::ResourceDef;

/// The answer to one create: the request with `status.token`, as CDI's cdi-apiserver gives it.
pub async fn create(
    key: &TokenKey,
    kube: Option<&kube::Client>,
    def: &ResourceDef,
    namespace: &str,
    body: &Value,
    now: i64,
) -> ApiResult<Value> {
    let (pruned, _unknown) = (def.decode)(body)
        .map_err(|errs| ApiError::invalid(def.kind, def.group, &name_of(body), &errs))?;
    let errs = (def.validate)(&pruned);
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            def.kind,
            def.group,
            &name_of(body),
            &errs,
        ));
    }
    let mut req: UploadTokenRequest = serde_json::from_value(pruned)
        .map_err(|e| ApiError::internal(format!("decoded UploadTokenRequest: {e}")))?;
    let pvc = req.spec.pvc_name.clone();
    if let Some(kube) = kube {
        check_claim(kube, def, namespace, &pvc, &name_of(body)).await?;
    }
    req.api_version = Some(kubevirt_api::cdi::upload::API_VERSION.into());
    req.kind = Some(def.kind.into());
    req.metadata.namespace = Some(namespace.into());
    req.status = Some(UploadTokenRequestStatus {
        token: key.sign(namespace, &pvc, now),
    });
    tracing::info!(namespace, pvc = %pvc, "issued an upload token");
    serde_json::to_value(&req).map_err(|e| ApiError::internal(e.to_string()))
}

fn name_of(body: &Value) -> String {
    body.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The claim exists and takes uploads (a DataVolume's `upload` source or CDI's annotation):
/// a token for anything else could never be used, so the user hears why now.
async fn check_claim(
    kube: &kube::Client,
    def: &ResourceDef,
    namespace: &str,
    pvc: &str,
    name: &str,
) -> ApiResult<()> {
    let claims: kube::Api<PersistentVolumeClaim> = kube::Api::namespaced(kube.clone(), namespace);
    let refuse = |detail: String| {
        ApiError::invalid(
            def.kind,
            def.group,
            name,
            &[FieldError::invalid("spec.pvcName", pvc, &detail)],
        )
    };
    match claims.get_opt(pvc).await {
        Ok(Some(c)) if c.annotations().contains_key(UPLOAD_TARGET) => Ok(()),
        Ok(Some(_)) => Err(refuse(format!(
            "PersistentVolumeClaim {namespace}/{pvc} is not an upload target: create it with \
             virtctl image-upload, as a DataVolume with source.upload, or annotate it \
             {UPLOAD_TARGET}"
        ))),
        Ok(None) => Err(refuse(format!(
            "PersistentVolumeClaim {namespace}/{pvc} not found: create the DataVolume (or claim) first"
        ))),
        Err(e) => Err(ApiError::internal(format!(
            "reading PersistentVolumeClaim {namespace}/{pvc}: {e}"
        ))),
    }
}
