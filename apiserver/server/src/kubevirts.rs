//! `kubevirts` at `kubevirt.io/v1`: a thin proxy over the `kubevirt.io/v1alpha3` CRD in
//! kube-apiserver.
//!
//! Why: KubeVirt users apply their KubeVirt resource at `kubevirt.io/v1`, but that
//! group-version belongs to this server's APIService (a CRD version v1 in the group would
//! make kube-apiserver's autoregister controller take the APIService away, docs/deploy.md).
//! kube-apiserver keeps storing the objects (the operator reads them there, also while this
//! server is down); this server only authorizes the user (the usual SubjectAccessReview, in
//! [`crate::http::router`], before [`handle`] runs), forwards the request with its own
//! credentials to `/apis/kubevirt.io/v1alpha3/...`, and rewrites `apiVersion` between the two
//! versions in request bodies, responses, list items, Table rows and watch events. Status
//! codes, Status errors, resourceVersions, query parameters and the Accept header pass
//! through unchanged, so kube-apiserver's CRD semantics (validation, pruning, patch types,
//! server-side apply, Table output, watch) are the resource's.

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http::{Method, StatusCode, header};
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::request::RequestInfo;
use crate::state::AppState;

/// `apiVersion` clients see.
pub const SERVED: &str = "kubevirt.io/v1";
/// `apiVersion` kube-apiserver stores.
pub const STORED: &str = kubevirt_api::kubevirt::CRD_API_VERSION;
/// Plural of the resource handled here.
pub const PLURAL: &str = kubevirt_api::kubevirt::PLURAL;

/// The request headers worth forwarding: what kube-apiserver negotiates on, and the
/// User-Agent it names a field manager after when the client sets no `fieldManager`.
/// Authentication headers are not forwarded: the request is made with this server's
/// credentials.
const FORWARDED_HEADERS: [header::HeaderName; 3] =
    [header::CONTENT_TYPE, header::ACCEPT, header::USER_AGENT];

/// Rewrites the `apiVersion` of one object, and of its managedFields entries (kube-apiserver
/// records the version a manager wrote with, and refuses an update whose managedFields name
/// a version the CRD does not serve), from `from` to `to`. Nothing else: an ownerReference
/// to a `kubevirt.io/v1` VirtualMachine must stay as it is.
fn rewrite_object(obj: &mut Value, from: &str, to: &str) {
    let Value::Object(m) = obj else {
        return;
    };
    if m.get("apiVersion").and_then(Value::as_str) == Some(from) {
        m.insert("apiVersion".into(), Value::String(to.into()));
    }
    if let Some(Value::Array(entries)) = m
        .get_mut("metadata")
        .and_then(|md| md.get_mut("managedFields"))
    {
        for e in entries {
            if e.get("apiVersion").and_then(Value::as_str) == Some(from)
                && let Some(e) = e.as_object_mut()
            {
                e.insert("apiVersion".into(), Value::String(to.into()));
            }
        }
    }
}

/// A request body on its way to kube-apiserver: the object (create, update, merge patch,
/// apply patch) at v1alpha3; in a JSON patch, the values of operations on `/apiVersion`.
pub fn rewrite_request(body: &mut Value) {
    match body {
        Value::Array(ops) => {
            for op in ops {
                if op.get("path").and_then(Value::as_str) == Some("/apiVersion")
                    && op.get("value").and_then(Value::as_str) == Some(SERVED)
                    && let Some(op) = op.as_object_mut()
                {
                    op.insert("value".into(), Value::String(STORED.into()));
                }
            }
        }
        obj => rewrite_object(obj, SERVED, STORED),
    }
}

/// A response from kube-apiserver on its way to the client: an object, a list (its items),
/// a Table (the objects of its rows, with `includeObject=Object`) or a Status (unchanged),
/// at v1.
pub fn rewrite_response(body: &mut Value) {
    rewrite_object(body, STORED, SERVED);
    if let Some(Value::Array(items)) = body.get_mut("items") {
        for item in items {
            rewrite_object(item, STORED, SERVED);
        }
    }
    if body.get("kind").and_then(Value::as_str) == Some("Table")
        && let Some(Value::Array(rows)) = body.get_mut("rows")
    {
        for row in rows {
            if let Some(obj) = row.get_mut("object") {
                rewrite_object(obj, STORED, SERVED);
            }
        }
    }
}

/// One watch event line (`{"type":…,"object":…}` and its newline) at v1; a line that is not
/// JSON passes unchanged.
pub fn rewrite_watch_line(line: &[u8]) -> Bytes {
    let Ok(mut ev) = serde_json::from_slice::<Value>(line) else {
        return Bytes::copy_from_slice(line);
    };
    if let Some(obj) = ev.get_mut("object") {
        rewrite_response(obj);
    }
    let mut out = serde_json::to_vec(&ev).unwrap_or_else(|_| line.to_vec());
    out.push(b'\n');
    Bytes::from(out)
}

/// The kube-apiserver path of an authorized request, built from what was authorized (its
/// namespace, name and subresource) rather than from the raw path: the path is sent with
/// virt-apiserver's credentials, and kube-apiserver decodes `%2F` and the like where the
/// authorization did not (N13 of the security review at bd37f96). A namespace or name that
/// is not one a Kubernetes object can have is refused.
pub fn upstream_path(info: &RequestInfo) -> ApiResult<String> {
    let valid = |what: &str, s: &str| -> ApiResult<()> {
        match kubevirt_api::validation::dns1123_subdomain_errors(s).first() {
            Some(e) => Err(ApiError::bad_request(format!("invalid {what} {s:?}: {e}"))),
            None => Ok(()),
        }
    };
    let mut path = format!("/apis/{STORED}/");
    if info.verb == "watch" && info.path.contains("/watch/") {
        path.push_str("watch/");
    }
    if !info.namespace.is_empty() {
        valid("namespace", &info.namespace)?;
        path.push_str(&format!("namespaces/{}/", info.namespace));
    }
    path.push_str(&info.resource);
    if !info.name.is_empty() && !info.is_collection {
        valid("name", &info.name)?;
        path.push('/');
        path.push_str(&info.name);
        if !info.subresource.is_empty() {
            path.push('/');
            path.push_str(&info.subresource);
        }
    }
    Ok(path)
}

/// How often [`follow_crd`] looks at kube-apiserver.
const CRD_PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Keeps `served` telling whether kube-apiserver serves the KubeVirt CRD at [`STORED`] (its
/// group-version discovery answers), so discovery lists `kubevirts` exactly while they can be
/// read ([`crate::discovery::Discovery::kubevirts_served`]). The first look happens before
/// this returns (at most 5 s: the first discovery document served is right), then every
/// [`CRD_PROBE_INTERVAL`] until `shutdown`; an unreachable kube-apiserver changes nothing.
pub async fn follow_crd(
    kube: kube::Client,
    served: std::sync::Arc<std::sync::atomic::AtomicBool>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), probe_crd(&kube)).await;
    record(&served, first.unwrap_or(None));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(CRD_PROBE_INTERVAL) => {}
            }
            record(&served, probe_crd(&kube).await);
        }
    });
}

/// Whether kube-apiserver serves [`STORED`]; `None` when it cannot tell.
async fn probe_crd(kube: &kube::Client) -> Option<bool> {
    let req = http::Request::get(format!("/apis/{STORED}"))
        .body(kube::client::Body::empty())
        .ok()?;
    match kube.send(req).await {
        Ok(r) if r.status().is_success() => Some(true),
        Ok(r) if r.status() == StatusCode::NOT_FOUND => Some(false),
        Ok(r) => {
            tracing::debug!(status = %r.status(), "probing the KubeVirt CRD");
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, "probing the KubeVirt CRD");
            None
        }
    }
}

fn record(served: &std::sync::atomic::AtomicBool, now: Option<bool>) {
    use std::sync::atomic::Ordering;
    if let Some(now) = now
        && served.swap(now, Ordering::Relaxed) != now
    {
        tracing::info!(
            "KubeVirt CRD ({STORED}) {}: kubevirts at {SERVED} {}",
            if now { "served" } else { "not served" },
            if now {
                "advertised"
            } else {
                "no longer advertised"
            }
        );
    }
}

fn media_type(headers: &http::HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|c| c.split(';').next())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// The body of a request at v1alpha3. JSON and YAML bodies are decoded, rewritten and sent
/// as JSON (valid YAML too, so `application/apply-patch+yaml` and `application/yaml` keep
/// their content type); anything else passes unchanged and kube-apiserver judges it.
fn request_body(content_type: &str, bytes: Bytes) -> Bytes {
    if bytes.is_empty() {
        return bytes;
    }
    let parsed: Option<Value> = if content_type.ends_with("yaml") {
        std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| serde_saphyr::from_str::<Value>(t).ok())
    } else if content_type.ends_with("json") || content_type.is_empty() {
        serde_json::from_slice(&bytes).ok()
    } else {
        None
    };
    match parsed {
        Some(mut v) => {
            rewrite_request(&mut v);
            serde_json::to_vec(&v).map(Bytes::from).unwrap_or(bytes)
        }
        // Malformed: kube-apiserver's decoding error is the one the client should see.
        None => bytes,
    }
}

fn unreachable(e: impl std::fmt::Display) -> ApiError {
    ApiError::unavailable(format!(
        "kube-apiserver, which stores kubevirts.kubevirt.io (served here at {SERVED} over \
         {STORED}), is unreachable: {e}"
    ))
}

/// Serves one authorized request for `kubevirts` (any verb, main resource or `/status`).
pub async fn handle(st: &AppState, info: &RequestInfo, req: Request) -> ApiResult<Response> {
    // Without kube-apiserver (--standalone) there is no storage: not advertised, not found.
    let Some(kube) = st.auth.kube.clone() else {
        // Read the body first (bounded, see `read_body`): answered while still sending,
        // an HTTP/1.1 client gets its connection reset instead of the 404.
        let _ = st.read_body(req).await;
        return Err(ApiError::path_not_found());
    };
    if !matches!(info.subresource.as_str(), "" | "status") {
        return Err(ApiError::path_not_found());
    }
    let method = req.method().clone();
    let path = upstream_path(info)?;
    let uri = match req.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let mut forward = http::Request::builder().method(method.clone()).uri(&uri);
    for h in FORWARDED_HEADERS {
        if let Some(v) = req.headers().get(&h) {
            forward = forward.header(h, v.clone());
        }
    }
    let content_type = media_type(req.headers());
    let body = if matches!(method, Method::GET | Method::HEAD) {
        Bytes::new()
    } else {
        let (_, bytes) = st.read_body(req).await?;
        request_body(&content_type, bytes)
    };
    let forward = forward
        .body(kube::client::Body::from(body.to_vec()))
        .map_err(|e| ApiError::internal(format!("building the request to kube-apiserver: {e}")))?;
    tracing::debug!(%method, uri, "Forwarding to kube-apiserver");
    let resp = kube.send(forward).await.map_err(|e| {
        tracing::warn!(error = %e, uri, "kube-apiserver unreachable");
        unreachable(e)
    })?;
    let (parts, body) = resp.into_parts();
    let mut out = Response::builder().status(parts.status);
    for (name, value) in &parts.headers {
        // Length and encoding are the rewritten body's own.
        if matches!(
            *name,
            header::CONTENT_LENGTH | header::TRANSFER_ENCODING | header::CONNECTION
        ) {
            continue;
        }
        out = out.header(name, value.clone());
    }
    let resp_type = media_type(&parts.headers);
    let watching = info.verb == "watch" && parts.status == StatusCode::OK;
    let body = if watching && resp_type.ends_with("json") {
        watch_body(body, st.shutdown.clone())
    } else {
        let bytes = body.collect_bytes().await.map_err(unreachable)?;
        Body::from(response_body(&resp_type, bytes))
    };
    out.body(body)
        .map_err(|e| ApiError::internal(format!("building the response: {e}")))
}

/// A whole (non-watch) response body at v1.
fn response_body(content_type: &str, bytes: Bytes) -> Bytes {
    if content_type.ends_with("json") {
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(mut v) => {
                rewrite_response(&mut v);
                serde_json::to_vec(&v).map(Bytes::from).unwrap_or(bytes)
            }
            Err(_) => bytes,
        }
    } else if content_type.ends_with("yaml") {
        let parsed = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| serde_saphyr::from_str::<Value>(t).ok());
        match parsed {
            Some(mut v) => {
                rewrite_response(&mut v);
                serde_saphyr::to_string(&v)
                    .map(Bytes::from)
                    .unwrap_or(bytes)
            }
            None => bytes,
        }
    } else {
        bytes
    }
}

/// A watch stream at v1, event by event: kube-apiserver ends every event with a newline, so
/// each complete line is rewritten and sent at once (an event is never held back waiting for
/// the next). It ends at `shutdown`, like this server's own watches: a graceful shutdown
/// waits for open requests, and the client re-establishes the watch on another replica.
fn watch_body(body: kube::client::Body, shutdown: tokio_util::sync::CancellationToken) -> Body {
    use http_body_util::BodyExt;
    let mut upstream = body.into_data_stream();
    let stream = async_stream::stream! {
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let chunk = tokio::select! {
                _ = shutdown.cancelled() => break,
                c = upstream.next() => c,
            };
            let Some(chunk) = chunk else { break };
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    // The client sees the watch end and re-establishes it, as after any
                    // dropped watch.
                    tracing::debug!(error = %e, "kube-apiserver watch stream ended");
                    break;
                }
            };
            pending.extend_from_slice(&chunk);
            while let Some(i) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                yield Ok::<Bytes, std::io::Error>(rewrite_watch_line(&line));
            }
        }
        if !pending.iter().all(u8::is_ascii_whitespace) {
            yield Ok(rewrite_watch_line(&pending));
        }
    };
    Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn the_upstream_path_is_what_was_authorized() {
        use crate::request::{Query, request_info};
        let up = |method: &str, path: &str, query: &str| {
            upstream_path(&request_info(method, path, &Query::parse(Some(query))))
        };
        assert_eq!(
            up(
                "GET",
                "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt/status",
                ""
            )
            .unwrap(),
            "/apis/kubevirt.io/v1alpha3/namespaces/kubevirt/kubevirts/kubevirt/status"
        );
        assert_eq!(
            up("GET", "/apis/kubevirt.io/v1/kubevirts", "").unwrap(),
            "/apis/kubevirt.io/v1alpha3/kubevirts"
        );
        assert_eq!(
            up(
                "GET",
                "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts",
                "watch=1"
            )
            .unwrap(),
            "/apis/kubevirt.io/v1alpha3/namespaces/kubevirt/kubevirts"
        );
        assert_eq!(
            up(
                "GET",
                "/apis/kubevirt.io/v1/watch/namespaces/kubevirt/kubevirts",
                ""
            )
            .unwrap(),
            "/apis/kubevirt.io/v1alpha3/watch/namespaces/kubevirt/kubevirts"
        );
        // An encoded slash names no object: refused, never passed on to be decoded.
        assert!(
            up(
                "GET",
                "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/a%2F..%2Fb",
                ""
            )
            .is_err()
        );
    }

    #[test]
    fn requests_go_to_v1alpha3_with_their_managed_fields_owner_references_stay() {
        let mut obj = json!({"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt",
                "managedFields": [{"manager": "kubectl", "apiVersion": "kubevirt.io/v1"},
                                  {"manager": "x", "apiVersion": "kubevirt.io/v1alpha3"}],
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                    "name": "vm", "uid": "u"}]},
            "spec": {"imagePullPolicy": "IfNotPresent"}});
        rewrite_request(&mut obj);
        assert_eq!(obj["apiVersion"], STORED);
        assert_eq!(obj["metadata"]["managedFields"][0]["apiVersion"], STORED);
        assert_eq!(obj["metadata"]["managedFields"][1]["apiVersion"], STORED);
        assert_eq!(
            obj["metadata"]["ownerReferences"][0]["apiVersion"],
            "kubevirt.io/v1"
        );
        assert_eq!(obj["spec"]["imagePullPolicy"], "IfNotPresent");

        // A merge patch without apiVersion is left alone; a JSON patch's apiVersion value moves.
        let mut merge = json!({"spec": {"imageTag": "v2"}});
        rewrite_request(&mut merge);
        assert_eq!(merge, json!({"spec": {"imageTag": "v2"}}));
        let mut ops = json!([{"op": "test", "path": "/apiVersion", "value": "kubevirt.io/v1"},
            {"op": "replace", "path": "/spec/imageTag", "value": "kubevirt.io/v1"}]);
        rewrite_request(&mut ops);
        assert_eq!(ops[0]["value"], STORED);
        assert_eq!(ops[1]["value"], "kubevirt.io/v1");
    }

    #[test]
    fn responses_objects_lists_tables_and_statuses() {
        let mut obj = json!({"apiVersion": STORED, "kind": "KubeVirt", "metadata": {"name": "a",
            "resourceVersion": "42", "managedFields": [{"apiVersion": STORED}]}});
        rewrite_response(&mut obj);
        assert_eq!(obj["apiVersion"], SERVED);
        assert_eq!(obj["metadata"]["managedFields"][0]["apiVersion"], SERVED);
        assert_eq!(obj["metadata"]["resourceVersion"], "42");

        let mut list = json!({"apiVersion": STORED, "kind": "KubeVirtList",
            "metadata": {"resourceVersion": "7", "continue": "c"},
            "items": [{"apiVersion": STORED, "kind": "KubeVirt"}, {"apiVersion": STORED}]});
        rewrite_response(&mut list);
        assert_eq!(list["apiVersion"], SERVED);
        assert!(
            list["items"]
                .as_array()
                .unwrap()
                .iter()
                .all(|i| i["apiVersion"] == SERVED)
        );
        assert_eq!(list["metadata"]["continue"], "c");

        let mut table = json!({"apiVersion": "meta.k8s.io/v1", "kind": "Table",
            "rows": [{"cells": ["kubevirt"], "object": {"apiVersion": STORED, "kind": "KubeVirt"}},
                     {"cells": ["x"], "object": {"apiVersion": "meta.k8s.io/v1",
                        "kind": "PartialObjectMetadata"}}]});
        rewrite_response(&mut table);
        assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(table["rows"][0]["object"]["apiVersion"], SERVED);
        assert_eq!(table["rows"][1]["object"]["apiVersion"], "meta.k8s.io/v1");

        let status = json!({"apiVersion": "v1", "kind": "Status", "code": 404,
            "reason": "NotFound", "details": {"group": "kubevirt.io", "kind": "kubevirts"}});
        let mut s = status.clone();
        rewrite_response(&mut s);
        assert_eq!(s, status);
    }

    #[test]
    fn watch_lines_carry_v1_objects() {
        let line = br#"{"type":"ADDED","object":{"apiVersion":"kubevirt.io/v1alpha3","kind":"KubeVirt","metadata":{"name":"kubevirt","resourceVersion":"9"}}}
"#;
        let out = rewrite_watch_line(line);
        assert!(out.ends_with(b"\n"));
        let ev: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(ev["type"], "ADDED");
        assert_eq!(ev["object"]["apiVersion"], SERVED);
        assert_eq!(ev["object"]["metadata"]["resourceVersion"], "9");
        // An ERROR event's Status is passed as it is.
        let err = br#"{"type":"ERROR","object":{"apiVersion":"v1","kind":"Status","code":410}}"#;
        let ev: Value = serde_json::from_slice(&rewrite_watch_line(err)).unwrap();
        assert_eq!(ev["object"]["code"], 410);
        assert_eq!(
            rewrite_watch_line(b"not json"),
            Bytes::from_static(b"not json")
        );
    }

    #[test]
    fn yaml_and_apply_bodies_are_rewritten_as_json() {
        let yaml =
            b"apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: kubevirt}\nspec: {}\n";
        let out = request_body("application/apply-patch+yaml", Bytes::from_static(yaml));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["apiVersion"], STORED);
        // Garbage is kube-apiserver's to refuse.
        let bad = Bytes::from_static(b"{not json");
        assert_eq!(request_body("application/json", bad.clone()), bad);
    }
}
