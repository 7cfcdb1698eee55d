//! virt-apiserver binary: configuration, wiring, signals.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use clap::Parser;
use tokio_util::sync::CancellationToken;
use virt_apiserver::auth::{AuthConfig, CaPool, RequestHeaderConfig};
use virt_apiserver::config::Args;
use virt_apiserver::state::{AppState, LauncherEviction};
use virt_apiserver::{discovery, handler, http, metrics, openapi, rest, server, storage};

fn init_tracing(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: `kubectl logs` shows escape codes as text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn read(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// The CAs clients are verified against: the flags' files, or what kube-apiserver publishes
/// for extension servers (kube-system/extension-apiserver-authentication); and the inputs
/// they were made from, to tell a rotation.
async fn client_trust(
    args: &Args,
    kube: Option<&kube::Client>,
) -> anyhow::Result<(Option<RequestHeaderConfig>, Option<CaPool>, Vec<u8>)> {
    let published = match kube {
        Some(k) if args.requestheader_client_ca_file.is_none() || args.client_ca_file.is_none() => {
            virt_apiserver::authconfig::read_published(k.clone()).await
        }
        _ => None,
    };
    let mut inputs = Vec::new();
    let request_header = match &args.requestheader_client_ca_file {
        Some(p) => {
            let pem = read(p)?;
            inputs.extend_from_slice(&pem);
            Some(RequestHeaderConfig {
                ca: CaPool::from_pem(&pem).context("requestheader client CA")?,
                allowed_names: args
                    .requestheader_allowed_names
                    .iter()
                    .filter(|s| !s.is_empty())
                    .cloned()
                    .collect(),
                username_headers: args.requestheader_username_headers.clone(),
                group_headers: args.requestheader_group_headers.clone(),
                extra_prefixes: args.requestheader_extra_headers_prefix.clone(),
            })
        }
        None => published.as_ref().and_then(|p| p.request_header.clone()),
    };
    let client_ca = match &args.client_ca_file {
        Some(p) => {
            let pem = read(p)?;
            inputs.extend_from_slice(&pem);
            Some(CaPool::from_pem(&pem).context("client CA")?)
        }
        None => published.as_ref().and_then(|p| p.client_ca.clone()),
    };
    if let Some(p) = &published {
        inputs.extend_from_slice(p.source.as_bytes());
    }
    Ok((request_header, client_ca, inputs))
}

/// Reads the client CAs again every `--ca-reload-seconds` and puts a rotated one in use
/// (L3 of the security review at 5efe883: they were read once, so a rotated front-proxy
/// CA locked kube-apiserver out until a restart).
fn follow_client_trust(args: &Args, auth: AuthConfig, mut inputs: Vec<u8>) {
    let args = args.clone();
    let every = std::time::Duration::from_secs(args.ca_reload_seconds.max(1));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            match client_trust(&args, auth.kube.as_ref()).await {
                Ok((rh, ca, now)) if now != inputs => {
                    tracing::info!("client CAs changed: new connections are verified against them");
                    auth.set_trust(rh, ca);
                    inputs = now;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "reading the client CAs again; keeping those in use")
                }
            }
        }
    });
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Release builds unwind (Cargo.toml [profile.release]): a panic inside a request's
    // handler becomes that request's 500 (http::guarded); any other panic ends the process.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |p| {
        hook(p);
        if !virt_apiserver::http::in_request() {
            std::process::abort()
        }
    }));
    let args = Args::parse();
    init_tracing(&args.log_format);
    let _ = rustls::crypto::ring::default_provider().install_default();

    let kube = if args.standalone {
        None
    } else {
        let config = match &args.kubeconfig {
            Some(p) => {
                let kc = kube::config::Kubeconfig::read_from(p).context("reading kubeconfig")?;
                kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .context("kubeconfig")?
            }
            None => kube::Config::infer().await.context(
                "no kube-apiserver configuration (use --standalone for local development)",
            )?,
        };
        Some(kube_client_metrics::client(config).context("kube client")?)
    };
    let (request_header, client_ca, trust_inputs) = client_trust(&args, kube.as_ref()).await?;
    let handler_tls = handler::client_tls(&handler::HandlerTlsFiles {
        ca: args.handler_ca.clone(),
        cert: args.handler_client_cert.clone(),
        key: args.handler_client_key.clone(),
    })?;
    if handler_tls.is_none() {
        tracing::warn!(
            "No virt-handler client certificate: pause, unpause, softreboot, console and vnc answer 503"
        );
    }
    let handler = handler::HandlerClient::new(
        handler_tls,
        handler::parse_addresses(&args.handler_address)?,
        kube.clone(),
        args.handler_namespace.clone(),
        args.handler_port,
    );
    let auth = AuthConfig::new(request_header, client_ca, kube, args.allow_client_ca_users);
    follow_client_trust(&args, auth.clone(), trust_inputs);

    let etcd_tls = match (&args.etcd_cafile, &args.etcd_certfile, &args.etcd_keyfile) {
        (Some(ca), Some(cert), Some(key)) => Some(Arc::new(
            virt_certs::reload::Reloading::new(
                "etcd client TLS (--etcd-cafile, --etcd-certfile, --etcd-keyfile)",
                vec![ca.clone(), cert.clone(), key.clone()],
                |c| {
                    Ok(storage::EtcdTls {
                        ca_pem: String::from_utf8(c[0].clone())?,
                        cert_pem: String::from_utf8(c[1].clone())?,
                        key_pem: String::from_utf8(c[2].clone())?,
                    })
                },
            )
            .context("etcd client TLS")?,
        )),
        (None, None, None) => None,
        _ => anyhow::bail!("--etcd-cafile, --etcd-certfile and --etcd-keyfile go together"),
    };
    let storage = storage::Storage::connect_tls(
        &args.etcd_servers,
        etcd_tls.as_ref().map(|t| t.get()).as_deref(),
    )
    .await
    .context("connecting to etcd")?;
    let shutdown = CancellationToken::new();
    // The members of an etcd cluster that can serve, probed every second: a member that goes
    // down leaves rotation within about that, and the requests sent to it meanwhile are sent
    // again where that cannot apply them twice (storage::endpoints).
    storage.balance_endpoints(
        args.etcd_servers.clone(),
        etcd_tls.clone(),
        std::time::Duration::from_secs(1),
        shutdown.clone(),
    );
    if let Some(t) = etcd_tls {
        storage.follow_tls_files(
            args.etcd_servers.clone(),
            t,
            std::time::Duration::from_secs(20),
            shutdown.clone(),
        );
    }
    let metrics = Arc::new(metrics::Metrics::default());
    let storage = storage.with_metrics(metrics.storage.clone());
    let (gates, unenforced) = kubevirt_api::policy::FeatureGates::from_names(&args.feature_gates);
    tracing::info!(host_disk = gates.host_disk, ?unenforced, "Feature gates");
    // Our components' service accounts live in our own namespace.
    let policy = rest::Policy {
        gates,
        components_namespace: args.handler_namespace.clone(),
    };
    let mut registry = rest::Registry::new(storage, &args.etcd_prefix)
        .with_policy(policy)
        .with_clone_review(auth.clone());
    if args.watch_cache_history > 0 {
        registry = registry.with_watch_cache(
            args.watch_cache_history,
            metrics.cache_reads.clone(),
            shutdown.clone(),
        );
    }
    let state = Arc::new(AppState {
        registry: match &auth.kube {
            Some(k) => registry.with_namespace_lifecycle(
                virt_apiserver::admission::NamespaceLifecycle::new(k.clone()),
            ),
            None => registry,
        },
        discovery: discovery::Discovery::build(),
        openapi: openapi::build(),
        auth: auth.clone(),
        metrics,
        shutdown: shutdown.clone(),
        terminating: AtomicBool::new(false),
        etcd_answered: std::sync::Mutex::new(None),
        max_body_bytes: args.max_request_body_bytes,
        bookmark_interval: args.bookmark_interval(),
        handler,
        in_flight: virt_apiserver::inflight::InFlight::new(
            args.max_requests_inflight,
            args.max_mutating_requests_inflight,
        ),
        watches: virt_apiserver::inflight::PerUser::new(args.max_watches_per_user),
        streams: virt_apiserver::inflight::PerUser::new(args.max_streams_per_user),
        webhook_calls: virt_apiserver::inflight::PerSource::new(
            virt_apiserver::inflight::DEFAULT_WEBHOOK_PER_SOURCE,
            virt_apiserver::inflight::DEFAULT_WEBHOOK_TOTAL,
        ),
        eviction: LauncherEviction {
            kube: auth.kube.clone(),
            default_strategy: Some(args.eviction_strategy),
        },
        upload_tokens: upload_token_key(args.upload_token_key_file.as_deref())?,
    });
    if let Some(k) = &state.auth.kube {
        virt_apiserver::kubevirts::follow_crd(
            k.clone(),
            state.discovery.kubevirts_served.clone(),
            shutdown.clone(),
        )
        .await;
    }
    let tls = server::ServingTls::from_files(
        args.tls_cert_file.clone(),
        args.tls_private_key_file.clone(),
        &auth,
    )?;
    if let Some(addr) = args.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the metrics address {addr}"))?;
        tracing::info!(%addr, "Serving /metrics over plain HTTP");
        let (app, sd) = (
            http::metrics_router(state.metrics.clone()),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(sd.cancelled_owned())
                .await
            {
                tracing::error!(error = %e, "The metrics listener stopped");
            }
        });
    }
    let listener = server::listen(args.bind).with_context(|| format!("binding {}", args.bind))?;
    tracing::info!(addr = %listener.local_addr()?, "Serving");

    let signal_state = state.clone();
    let delay = std::time::Duration::from_secs(args.shutdown_delay_seconds);
    let sd = shutdown.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(error = %e, "Cannot install SIGTERM handler");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("Terminating: readiness off, then draining");
        signal_state.terminating.store(true, Ordering::Relaxed);
        tokio::time::sleep(delay).await;
        sd.cancel();
    });
    let limits = args.connection_limits();
    if let Some(addr) = args.upload_proxy_bind {
        // CDI's upload proxy: its own port and router, the same certificate and limits;
        // an upload is one long request, outside the API's in-flight limits.
        let listener =
            server::listen(addr).with_context(|| format!("binding the upload proxy {addr}"))?;
        tracing::info!(addr = %listener.local_addr()?, "Serving the upload proxy");
        let proxy = virt_apiserver::uploadproxy::router(Arc::new(
            virt_apiserver::uploadproxy::ProxyState::new(
                state.upload_tokens.clone(),
                auth.kube.clone(),
            ),
        ));
        let (tls, auth, sd) = (tls.clone(), auth.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = server::serve(listener, tls, proxy, auth, limits, sd).await {
                tracing::error!(error = %e, "The upload proxy stopped");
            }
        });
    }
    server::serve(listener, tls, http::router(state), auth, limits, shutdown).await?;
    tracing::info!("Stopped");
    Ok(())
}

/// The upload-token key: the file's bytes, or a random key without one.
fn upload_token_key(
    file: Option<&std::path::Path>,
) -> anyhow::Result<kubevirt_api::cdi::upload::TokenKey> {
    match file {
        Some(f) => {
            let bytes = std::fs::read(f)
                .with_context(|| format!("reading the upload token key {}", f.display()))?;
            if bytes.len() < kubevirt_api::cdi::upload::KEY_LEN {
                anyhow::bail!(
                    "the upload token key {} holds {} bytes; at least {} are needed",
                    f.display(),
                    bytes.len(),
                    kubevirt_api::cdi::upload::KEY_LEN
                );
            }
            Ok(kubevirt_api::cdi::upload::TokenKey::new(&bytes))
        }
        None => kubevirt_api::cdi::upload::TokenKey::random()
            .map_err(|_| anyhow::anyhow!("no random bytes for the upload token key")),
    }
}
