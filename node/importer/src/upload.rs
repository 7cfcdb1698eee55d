//! `virt-importer upload-server`: CDI's upload server. The DataVolume controller runs it in
//! an unprivileged pod with the claim mounted (a DataVolume with `source.upload`, or a claim
//! annotated `cdi.kubevirt.io/storage.upload.target`); the upload proxy, having checked the
//! user's token, streams `virtctl image-upload`'s body here.
//!
//! The body goes through the importer's own pipeline ([`crate::import::ingest`]): sniffed,
//! gz/xz unpacked in-stream, raw written sparse, other formats spooled and converted by
//! qemu-img, into `disk.img.importing`, renamed to `disk.img` only when complete. A failed
//! upload leaves the claim as it was and the server waiting for another attempt (virtctl
//! retries); the first complete one ends the server, whose termination message the
//! controller reads as the importer's.
//!
//! No credentials here: whoever reaches this port may write the claim, which is why the
//! controller's pod has no API token and the proxy is the only one told where it listens.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::{Mutex, watch};

use crate::import::{Outcome, Source, ingest, prepare};
use crate::progress::Progress;
use crate::result::ImportError;

/// The paths CDI's upload server (and proxy) serve raw bodies on. `-async` answers the same
/// here: it returns once the image is in the claim (CDI's returns once the bytes arrived;
/// virtctl polls the claim's phase afterwards either way).
pub const UPLOAD_PATHS: [&str; 2] = ["/v1beta1/upload", "/v1beta1/upload-async"];

/// CDI's multipart variants (a `file` part): not served yet, answered with what to use.
pub const FORM_PATHS: [&str; 2] = ["/v1beta1/upload-form", "/v1beta1/upload-form-async"];

/// The readiness path the pod's probe asks.
pub const HEALTHZ: &str = "/healthz";

/// What to serve, from the command line.
#[derive(Debug, Clone)]
pub struct UploadConfig {
    /// A Filesystem claim's mount directory or a block device.
    pub target: PathBuf,
    /// Usable bytes of the target (the size of `disk.img`).
    pub size: Option<u64>,
    pub scratch: Option<PathBuf>,
    pub progress_file: Option<PathBuf>,
    pub qemu_img: PathBuf,
}

#[derive(Debug)]
struct ServerState {
    cfg: UploadConfig,
    /// Held for the whole of one upload: a second concurrent one is refused (two writers of
    /// one `disk.img.importing` would interleave).
    busy: Mutex<()>,
    done: watch::Sender<Option<Outcome>>,
}

/// Serves uploads on `listener` until one completes; returns what it wrote.
pub async fn serve(
    cfg: UploadConfig,
    listener: tokio::net::TcpListener,
) -> Result<Outcome, ImportError> {
    let (done, mut finished) = watch::channel(None);
    let state = Arc::new(ServerState {
        cfg,
        busy: Mutex::new(()),
        done,
    });
    let app = router(state.clone());
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    tracing::info!(addr = ?addr, target = %state.cfg.target.display(), "upload server listening");
    let shutdown = async move {
        // Ends once an upload completed; graceful shutdown still answers that request.
        let _ = finished.wait_for(Option::is_some).await;
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| ImportError::InvalidArgument(format!("serving uploads: {e}")))?;
    let outcome = state.done.borrow().clone();
    outcome.ok_or_else(|| ImportError::InvalidArgument("the upload server stopped".into()))
}

fn router(state: Arc<ServerState>) -> Router {
    let mut r = Router::new().route(HEALTHZ, get(|| async { "ok" }));
    for p in UPLOAD_PATHS {
        r = r.route(
            p,
            post(upload).put(upload).head(|| async { StatusCode::OK }),
        );
    }
    for p in FORM_PATHS {
        r = r.route(p, post(form_unsupported));
    }
    // The image is streamed, never held: no body limit.
    r.layer(DefaultBodyLimit::disable()).with_state(state)
}

async fn form_unsupported() -> Response {
    (
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "multipart uploads are not served by kubevirt-rs yet: send the image as the raw body \
         (Content-Type: application/octet-stream) to /v1beta1/upload or /v1beta1/upload-async, \
         as virtctl image-upload does",
    )
        .into_response()
}

async fn upload(State(st): State<Arc<ServerState>>, req: Request) -> Response {
    if st.done.borrow().is_some() {
        return (
            StatusCode::CONFLICT,
            "the claim already holds a completed upload",
        )
            .into_response();
    }
    let Ok(_guard) = st.busy.try_lock() else {
        return (
            StatusCode::CONFLICT,
            "another upload into this claim is in progress; wait for it to end",
        )
            .into_response();
    };
    let total = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body: Body = req.into_body();
    match receive(&st.cfg, total, body).await {
        Ok(outcome) => {
            let message = outcome.message();
            tracing::info!(%message, "upload complete");
            st.done.send_replace(Some(outcome));
            (StatusCode::OK, message).into_response()
        }
        Err(e) => {
            let reason = e.reason();
            let message = e.to_string();
            tracing::warn!(reason, %message, "upload failed; the claim is unchanged");
            (status_of(&e), format!("{reason}: {message}")).into_response()
        }
    }
}

async fn receive(
    cfg: &UploadConfig,
    total: Option<u64>,
    body: Body,
) -> Result<Outcome, ImportError> {
    let (target, scratch) = prepare(&cfg.target, cfg.size, cfg.scratch.as_deref())?;
    let mut progress = Progress::new(cfg.progress_file.clone());
    let source = Source {
        name: "the upload".into(),
        total,
        checksum: None,
        qemu_img: &cfg.qemu_img,
    };
    let mut stream = body.into_data_stream();
    let result = ingest(
        &source,
        &target,
        scratch.as_deref(),
        &mut stream,
        &mut progress,
        |received, e| ImportError::Connection {
            url: "the upload".into(),
            detail: format!("the request body broke after {received} bytes: {e}"),
        },
    )
    .await;
    if result.is_err() {
        target.abandon();
        drain(&mut stream).await;
    }
    progress.finish(result.is_ok());
    result
}

/// Most clients read the answer only once they sent the whole body (a connection closed
/// under a body still being written reads as a broken connection, not as our 400): what is
/// left of a refused upload is read and dropped, up to [`DRAIN_LIMIT`].
async fn drain(stream: &mut axum::body::BodyDataStream) {
    use futures::StreamExt;
    let mut left = DRAIN_LIMIT;
    while let Some(Ok(chunk)) = stream.next().await {
        left = left.saturating_sub(chunk.len() as u64);
        if left == 0 {
            break;
        }
    }
}

/// How much of a refused upload is read to let the client see the answer.
const DRAIN_LIMIT: u64 = 64 << 20;

/// The client's fault (what it sent) is a 400, ours a 500.
pub fn status_of(e: &ImportError) -> StatusCode {
    match e {
        ImportError::TooLarge { .. }
        | ImportError::NotADiskImage { .. }
        | ImportError::BackingFile { .. }
        | ImportError::Conversion { .. }
        | ImportError::Checksum { .. }
        | ImportError::Connection { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_sent_is_the_clients_fault_and_disk_trouble_ours() {
        let bad = ImportError::NotADiskImage {
            detail: "text".into(),
        };
        assert_eq!(status_of(&bad), StatusCode::BAD_REQUEST);
        let too_large = ImportError::TooLarge {
            image: 2,
            usable: 1,
            at_least: false,
        };
        assert_eq!(status_of(&too_large), StatusCode::BAD_REQUEST);
        let write = ImportError::Write {
            path: "/data".into(),
            source: std::io::Error::other("full"),
        };
        assert_eq!(status_of(&write), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
