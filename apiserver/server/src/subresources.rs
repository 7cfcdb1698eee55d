//! subresources.kubevirt.io/v1: action subresources with KubeVirt's semantics and
//! status codes (202 on success, 409 when the run strategy or state forbids it), and
//! the pre-upgrade checks of the streaming subresources (console, vnc).
//!
//! VM actions only edit objects (runStrategy or status.stateChangeRequests; a
//! migration object); the controllers act on them. VMI actions and streams are
//! executed by the virt-handler of the VMI's node.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult, Gr};
use crate::kinds::ResourceDef;
use crate::request::{Query, RequestInfo};
use crate::rest::{Via, WriteOptions};
use crate::state::AppState;
use crate::stream::Keepalive;
use crate::volumes;

/// Field manager of writes made by action subresources.
const MANAGER: &str = "kubevirt-subresources";

/// Subresource handlers.
#[derive(Debug, Clone, Copy)]
struct Subresources<'a> {
    /// Where VMI actions and streams are executed.
    handler: &'a crate::handler::HandlerClient,
}

/// Dispatches a request under subresources.kubevirt.io/v1.
pub async fn handle(
    st: &Arc<AppState>,
    info: &RequestInfo,
    query: &Query,
    req: Request,
) -> ApiResult<Response> {
    Subresources {
        handler: &st.handler,
    }
    .handle(st, info, query, req)
    .await
}

use kubevirt_api::catalogue::VmAction;
use kubevirt_api::catalogue::{self, Subresource};
use kubevirt_api::common::ConditionStatus;
use kubevirt_api::handler_protocol::ForwardTarget;
use kubevirt_api::options::{MigrateOptions, RestartOptions, StartOptions, StopOptions};
use kubevirt_api::vm::{RunStrategy, VirtualMachineSpec};
use kubevirt_api::vmi::condition_types;
use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstancePhase as Phase};

pub(crate) fn vm_def() -> &'static ResourceDef {
    &kubevirt_api::kinds::vm::STRATEGY
}

pub(crate) fn vmi_def() -> &'static ResourceDef {
    &kubevirt_api::kinds::vmi::STRATEGY
}

fn vmim_def() -> &'static ResourceDef {
    &kubevirt_api::kinds::vmim::STRATEGY
}

/// KubeVirt words state conflicts with the singular resource name.
pub(crate) fn state_conflict(resource: &'static str, name: &str, why: &str) -> ApiError {
    ApiError::conflict(
        Gr {
            resource,
            group: crate::rest::GROUP,
        },
        name,
        why,
    )
}

/// The node a running VMI is on.
/// A stored VMI as its type: what the handlers decide on (phase, conditions, node).
fn typed_vmi(v: Value) -> ApiResult<VirtualMachineInstance> {
    serde_json::from_value(v)
        .map_err(|e| ApiError::internal(format!("stored VirtualMachineInstance: {e}")))
}

/// Virtctl retries on 400 until the VMI runs.
fn not_running(phase: &str) -> ApiError {
    ApiError::bad_request(format!(
        "Unable to connect to VirtualMachineInstance because phase is {phase} instead of Running"
    ))
}

fn node_of(vmi: &VirtualMachineInstance) -> ApiResult<&str> {
    vmi.status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::unavailable("the VMI runs but has no status.nodeName; retry shortly")
        })
}

fn accepted() -> Response {
    StatusCode::ACCEPTED.into_response()
}

/// Effective run strategy of a stored VM (runStrategy, else deprecated `running`), typed:
/// every handler below matches all strategies, so a new one does not compile unhandled.
fn run_strategy(vm: &Value) -> ApiResult<RunStrategy> {
    let spec: VirtualMachineSpec = serde_json::from_value(vm["spec"].clone())
        .map_err(|e| ApiError::internal(format!("stored VirtualMachine spec: {e}")))?;
    Ok(spec.effective_run_strategy())
}

fn vmi_running(vmi: Option<&Value>) -> bool {
    vmi.is_some_and(|v| {
        v.pointer("/metadata/deletionTimestamp").is_none()
            && !matches!(
                v.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            )
    })
}

fn push_request(vm: &mut Value, req: Value) {
    if !vm.get("status").is_some_and(Value::is_object) {
        vm["status"] = json!({});
    }
    let list = vm["status"]
        .as_object_mut()
        .map(|s| s.entry("stateChangeRequests").or_insert_with(|| json!([])));
    if let Some(Value::Array(a)) = list {
        a.push(req);
    }
}

/// The handler of a subresource. [`Subresources::handle`] dispatches on it with an
/// exhaustive match, so a route without a handler does not compile; a test checks that
/// every subresource discovery, OpenAPI and RBAC advertise (the resource table) has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Every VM action of the catalogue (`catalogue::VM_ACTIONS`): decoded with its entry
    /// and applied here ([`Subresources::apply_vm_action`]).
    VmAction,
    /// Every VMI action of the catalogue (`catalogue::VMI_ACTIONS`): checked against its
    /// entry and forwarded to the VMI's virt-handler.
    VmiAction,
    /// console, vnc, portforward: relayed to the VMI's virt-handler.
    VmiStream,
    /// Every guest-agent read of the catalogue (`catalogue::VMI_READS`): checked as KubeVirt's
    /// virt-api checks them and answered by the VMI's virt-handler.
    VmiRead,
    /// A VM with its instance type and preference expanded (expand.rs).
    ExpandSpec,
}

fn route(sub: &Subresource) -> Option<Route> {
    use catalogue as c;
    [
        (&c::CONSOLE, Route::VmiStream),
        (&c::VNC, Route::VmiStream),
        (&c::PORTFORWARD_VMI, Route::VmiStream),
        (&c::PORTFORWARD_VM, Route::VmiStream),
        (&c::EXPAND_SPEC, Route::ExpandSpec),
    ]
    .into_iter()
    .find(|(s, _)| *s == sub)
    .map(|(_, r)| r)
    .or_else(|| catalogue::vm_action(sub).map(|_| Route::VmAction))
    .or_else(|| catalogue::vmi_action(sub).map(|_| Route::VmiAction))
    .or_else(|| catalogue::vmi_read(sub).map(|_| Route::VmiRead))
}

/// The stream's path below the VMI at its handler: the subresource, and for portforward
/// the port and protocol (`portforward/22/tcp`), checked here so that bad input is a 400
/// naming it rather than a failed dial.
fn stream_path(sub: &Subresource, rest: &[String]) -> ApiResult<String> {
    if sub.path_params.is_empty() {
        return if rest.is_empty() {
            Ok(sub.name.to_string())
        } else {
            Err(ApiError::path_not_found())
        };
    }
    let (port, protocol) = match rest {
        [port] => (port, None),
        [port, protocol] => (port, Some(protocol.as_str())),
        _ => {
            return Err(ApiError::bad_request(format!(
                "{}: the path needs a port: {}/{{port}}[/{{protocol}}]",
                sub.name, sub.name
            )));
        }
    };
    ForwardTarget::parse(port, protocol)
        .map(|t| t.path(sub.name))
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

async fn body_bytes(body: axum::body::Body) -> ApiResult<axum::body::Bytes> {
    axum::body::to_bytes(body, 64 * 1024)
        .await
        .map_err(|_| ApiError::too_large("limit is 65536 bytes"))
}

impl Subresources<'_> {
    async fn handle(
        &self,
        st: &Arc<AppState>,
        info: &RequestInfo,
        query: &Query,
        req: Request,
    ) -> ApiResult<Response> {
        if info.resource == "version" && info.is_collection && info.namespace.is_empty() {
            return Ok(axum::Json(crate::discovery::version_info()).into_response());
        }
        // `namespaces/{ns}/expand-vm-spec`: an endpoint on no object.
        if info.resource == crate::expand::EXPAND_VM_SPEC
            && info.name.is_empty()
            && !info.namespace.is_empty()
        {
            if req.method() != http::Method::PUT {
                return Err(ApiError::method_not_allowed());
            }
            let bytes = axum::body::to_bytes(req.into_body(), st.max_body_bytes)
                .await
                .map_err(|_| {
                    ApiError::too_large(format!("limit is {} bytes", st.max_body_bytes))
                })?;
            return crate::expand::body(&st.registry, &info.namespace, &bytes).await;
        }
        let def = ResourceDef::by_plural(&info.resource).ok_or_else(ApiError::path_not_found)?;
        // Served when the catalogue has it and a handler serves it.
        let entry = def
            .subresource(&info.subresource)
            .filter(|_| !info.is_collection && !info.namespace.is_empty())
            .ok_or_else(ApiError::path_not_found)?;
        let route = route(entry).ok_or_else(ApiError::path_not_found)?;
        if req.method().as_str() != entry.http_method() {
            return Err(ApiError::method_not_allowed());
        }
        let sub = entry.name;
        let _ = query;
        // An action's path ends at its name, or at its fixed suffix (`evacuate/cancel`).
        let suffix_ok = match entry.suffix {
            "" => info.rest.is_empty(),
            s => info.rest.len() == 1 && info.rest[0] == s,
        };
        if !entry.is_stream() && !suffix_ok {
            return Err(ApiError::path_not_found());
        }
        let (mut parts, body) = req.into_parts();
        let (ns, name) = (info.namespace.as_str(), info.name.as_str());
        match route {
            Route::VmiStream => {
                let sub = stream_path(entry, &info.rest)?;
                let vm = entry.kind == &catalogue::VIRTUAL_MACHINE;
                self.stream(st, &mut parts, ns, name, &sub, vm).await
            }
            Route::VmAction => {
                // route() gives VmAction to catalogued VM actions only.
                let def = catalogue::vm_action(entry).ok_or_else(ApiError::path_not_found)?;
                let gates = &st.registry.policy().gates;
                if !def.feature_gates.is_empty()
                    && !def.feature_gates.iter().any(|g| gates.enabled(g))
                {
                    return Err(ApiError::bad_request(def.gate_refusal));
                }
                let action = (def.decode)(&body_bytes(body).await?)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                self.apply_vm_action(st, ns, name, action).await
            }
            Route::ExpandSpec => crate::expand::stored(&st.registry, ns, name).await,
            Route::VmiRead => {
                let vmi = typed_vmi(st.registry.get(vmi_def(), ns, name).await?)?;
                // KubeVirt's virt-api checks, with its words; its own answer is a 500 with
                // this text, ours the 409 Status it builds.
                let status = vmi.status.as_ref();
                if status.map(|s| s.phase) != Some(Phase::Running) {
                    return Err(state_conflict(
                        "virtualmachineinstance",
                        name,
                        "VMI is not running",
                    ));
                }
                if status
                    .and_then(|s| s.condition(condition_types::AGENT_CONNECTED))
                    .is_none()
                {
                    return Err(state_conflict(
                        "virtualmachineinstance",
                        name,
                        "VMI does not have guest agent connected",
                    ));
                }
                let node = node_of(&vmi)?;
                match self.handler.get_document(node, ns, name, sub).await {
                    Ok(doc) => {
                        Ok(([(http::header::CONTENT_TYPE, "application/json")], doc)
                            .into_response())
                    }
                    Err(e) => Ok(e.into_response()),
                }
            }
            Route::VmiAction => {
                // route() gives VmiAction to catalogued VMI actions only.
                let def = catalogue::vmi_action(entry).ok_or_else(ApiError::path_not_found)?;
                let bytes = body_bytes(body).await?;
                let (_, dry_run) =
                    (def.decode)(&bytes).map_err(|e| ApiError::bad_request(e.to_string()))?;
                let vmi = typed_vmi(st.registry.get(vmi_def(), ns, name).await?)?;
                self.vmi_must_run(&vmi, name)?;
                let paused = vmi
                    .status
                    .as_ref()
                    .and_then(|s| s.condition(condition_types::PAUSED))
                    .is_some_and(|c| c.status == ConditionStatus::True);
                if let Some(why) = def.refusal(paused).filter(|_| def.checked_by_api) {
                    return Err(state_conflict("virtualmachineinstance", name, why));
                }
                // KubeVirt answers a dry run after the checks, without the handler; otherwise
                // the handler gets the body as sent (KubeVirt passes it on too) and decodes
                // the action with the same catalogue entry.
                if !dry_run {
                    let node = node_of(&vmi)?;
                    if let Err(e) = self.handler.put_action(node, ns, name, sub, bytes).await {
                        return Ok(e.into_response());
                    }
                }
                Ok(StatusCode::OK.into_response())
            }
        }
    }

    /// console and vnc: checks, the client's upgrade, then the handler's websocket; the
    /// handler is dialled before answering 101 so that its errors (404, 409, busy VNC)
    /// reach the client as HTTP statuses rather than as a closed stream.
    async fn stream(
        &self,
        st: &Arc<AppState>,
        parts: &mut http::request::Parts,
        ns: &str,
        name: &str,
        sub: &str,
        of_vm: bool,
    ) -> ApiResult<Response> {
        use axum::extract::FromRequestParts;
        let vmi = match st.registry.get(vmi_def(), ns, name).await {
            // A VM's stream needs its instance: KubeVirt's answer for a stopped VM.
            Err(e) if of_vm && e.code == 404 => {
                st.registry.get(vm_def(), ns, name).await?;
                return Err(ApiError::bad_request(format!(
                    "VirtualMachine {name} is not running"
                )));
            }
            r => typed_vmi(r?)?,
        };
        self.vmi_must_run(&vmi, name)?;
        let node = node_of(&vmi)?;
        let upgrade = axum::extract::ws::WebSocketUpgrade::from_request_parts(parts, &())
            .await
            .map_err(|e| ApiError::bad_request(format!("{sub} needs a websocket upgrade: {e}")))?;
        let handler = match self
            .handler
            .dial_stream(node, ns, name, sub, parts.uri.query())
            .await
        {
            Ok(h) => h,
            Err(e) => return Ok(e.into_response()),
        };
        let shutdown = st.shutdown.clone();
        let metrics = st.metrics.clone();
        let what = format!("{sub} {ns}/{name} on {node}");
        let kind = crate::metrics::Connection::of(sub);
        let (ns_label, name_label) = (ns.to_string(), name.to_string());
        // The user's count of open streams (http.rs) drops when the relay ends.
        let slot = parts.extensions.remove::<crate::http::StreamSlot>();
        // Clients that offer no subprotocol (KubeVirt before #1485) are served too.
        Ok(upgrade
            .protocols([kubevirt_api::handler_protocol::PLAIN_SUBPROTOCOL])
            .max_message_size(crate::stream::MAX_CLIENT_MESSAGE)
            .max_frame_size(crate::stream::MAX_CLIENT_MESSAGE)
            .on_failed_upgrade(|e| tracing::debug!(error = %e, "Client upgrade failed"))
            .on_upgrade(move |client| {
                crate::http::guard(async move {
                    let _slot = slot;
                    // KubeVirt's gauge of the stream's kind, from the upgrade to the
                    // relay's end (virt-api counts from the established connection too).
                    let _active = kind.map(|k| {
                        crate::metrics::ActiveConnection::start(&metrics, k, &ns_label, &name_label)
                    });
                    // apiserver_longrunning_requests counts open consoles like watches.
                    let _open = crate::metrics::LongRunning::start(metrics);
                    crate::stream::relay(client, handler, Keepalive::default(), shutdown, what)
                        .await;
                })
            }))
    }

    /// Applies a VM action: the one match over them.
    async fn apply_vm_action(
        &self,
        st: &AppState,
        ns: &str,
        name: &str,
        action: VmAction,
    ) -> ApiResult<Response> {
        let dry_run = action.dry_run().map_err(ApiError::bad_request)?;
        match action {
            VmAction::Start(o) => self.start(st, ns, name, o, dry_run).await,
            VmAction::Stop(o) => self.stop(st, ns, name, o, dry_run).await,
            VmAction::Restart(o) => self.restart(st, ns, name, o, dry_run).await,
            VmAction::Migrate(o) => self.migrate(st, ns, name, o, dry_run).await,
            VmAction::EvacuateCancelVm(_) => {
                self.evacuate_cancel(st, ns, name, true, dry_run).await
            }
            VmAction::EvacuateCancelVmi(_) => {
                self.evacuate_cancel(st, ns, name, false, dry_run).await
            }
            VmAction::AddVolumeVm(o) => volumes::vm(st, ns, name, volumes::add(*o), dry_run).await,
            VmAction::RemoveVolumeVm(o) => {
                volumes::vm(st, ns, name, volumes::remove(o), dry_run).await
            }
            VmAction::AddVolumeVmi(o) => {
                volumes::vmi(st, ns, name, volumes::add(*o), dry_run).await
            }
            VmAction::RemoveVolumeVmi(o) => {
                volumes::vmi(st, ns, name, volumes::remove(o), dry_run).await
            }
        }
    }

    fn vmi_must_run(&self, vmi: &VirtualMachineInstance, name: &str) -> ApiResult<()> {
        let phase = vmi.status.as_ref().map(|s| s.phase).unwrap_or_default();
        match phase {
            Phase::Running => Ok(()),
            Phase::Failed => Err(state_conflict(
                "virtualmachineinstance",
                name,
                "VMI is in failed state",
            )),
            // virtctl retries on 400 until the VMI runs.
            Phase::Unset => Err(not_running(Phase::Pending.as_str())),
            other => Err(not_running(other.as_str())),
        }
    }

    async fn current_vmi(&self, st: &AppState, ns: &str, name: &str) -> ApiResult<Option<Value>> {
        match st.registry.get(vmi_def(), ns, name).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes the VMI's evacuation mark; virt-controller's evacuation controller then
    /// deletes the evacuation migration that has not finished. A VM's instance has its name.
    async fn evacuate_cancel(
        &self,
        st: &AppState,
        ns: &str,
        name: &str,
        of_vm: bool,
        dry_run: bool,
    ) -> ApiResult<Response> {
        if of_vm {
            // 404 names the VM when it does not exist.
            st.registry.get(vm_def(), ns, name).await?;
        }
        let Some(vmi) = self.current_vmi(st, ns, name).await? else {
            return Err(if of_vm {
                state_conflict("virtualmachine", name, "VM is not running")
            } else {
                ApiError::not_found(
                    Gr {
                        resource: "virtualmachineinstances",
                        group: crate::rest::GROUP,
                    },
                    name,
                )
            });
        };
        let vmi = typed_vmi(vmi)?;
        let marked = vmi
            .status
            .as_ref()
            .and_then(|s| s.evacuation_node_name.as_deref())
            .filter(|n| !n.is_empty());
        if marked.is_none() {
            return Err(state_conflict(
                "virtualmachineinstance",
                name,
                "VMI is not being evacuated",
            ));
        }
        let via = Via {
            status_only: true,
            manager: MANAGER,
        };
        st.registry
            .mutate(vmi_def(), ns, name, via, dry_run, |v| {
                if let Some(status) = v.get_mut("status").and_then(Value::as_object_mut) {
                    status.remove("evacuationNodeName");
                }
                Ok(())
            })
            .await?;
        Ok(StatusCode::OK.into_response())
    }

    async fn set_vmi_grace(
        &self,
        st: &AppState,
        ns: &str,
        name: &str,
        grace: i64,
        dry_run: bool,
    ) -> ApiResult<()> {
        let via = Via {
            status_only: false,
            manager: MANAGER,
        };
        st.registry
            .mutate(vmi_def(), ns, name, via, dry_run, |v| {
                v["spec"]["terminationGracePeriodSeconds"] = json!(grace);
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Sets the VM's run strategy, through the deprecated `running` field when the VM
    /// uses it (KubeVirt keeps the user's choice of field).
    async fn set_run_strategy(
        &self,
        st: &AppState,
        ns: &str,
        name: &str,
        dry_run: bool,
        vm: &Value,
        strategy: RunStrategy,
    ) -> ApiResult<()> {
        let uses_running =
            vm.pointer("/spec/runStrategy").is_none() && vm.pointer("/spec/running").is_some();
        let via = Via {
            status_only: false,
            manager: MANAGER,
        };
        st.registry
            .mutate(vm_def(), ns, name, via, dry_run, |v| {
                if uses_running {
                    v["spec"]["running"] = json!(strategy != RunStrategy::Halted);
                } else {
                    v["spec"]["runStrategy"] = json!(strategy.as_str());
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Appends state change requests to the VM's status.
    async fn push_requests(
        &self,
        st: &AppState,
        ns: &str,
        name: &str,
        dry_run: bool,
        reqs: Vec<Value>,
    ) -> ApiResult<()> {
        let via = Via {
            status_only: true,
            manager: MANAGER,
        };
        st.registry
            .mutate(vm_def(), ns, name, via, dry_run, |v| {
                for r in &reqs {
                    push_request(v, r.clone());
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    async fn start(
        &self,
        st: &AppState,
        ns: &str,
        name: &str,
        opts: StartOptions,
        dry_run: bool,
    ) -> ApiResult<Response> {
        let vm = st.registry.get(vm_def(), ns, name).await?;
        let vmi = self.current_vmi(st, ns, name).await?;
        let paused = opts.paused;
        let start_req = if paused {
            json!({"action": "Start", "data": {"startPaused": "true"}})
        } else {
            json!({"action": "Start"})
        };
        match run_strategy(&vm)? {
            RunStrategy::Halted => {
                // The paused start request goes in before the strategy flips (KubeVirt's
                // order): a Halted VM leaves a Start request alone, while a controller
                // that saw Always first would create the VMI unpaused.
                if paused {
                    self.push_requests(st, ns, name, dry_run, vec![start_req.clone()])
                        .await?;
                }
                self.set_run_strategy(st, ns, name, dry_run, &vm, RunStrategy::Always)
                    .await?;
            }
            RunStrategy::Manual | RunStrategy::RerunOnFailure => {
                if vmi_running(vmi.as_ref()) {
                    return Err(state_conflict(
                        "virtualmachine",
                        name,
                        "VM is already running",
                    ));
                }
                self.push_requests(st, ns, name, dry_run, vec![start_req.clone()])
                    .await?;
            }
            RunStrategy::Always | RunStrategy::Once if vmi_running(vmi.as_ref()) => {
                return Err(state_conflict(
                    "virtualmachine",
                    name,
                    "VM is already running",
                ));
            }
            other @ (RunStrategy::Always | RunStrategy::Once | RunStrategy::WaitAsReceiver) => {
                return Err(state_conflict(
                    "virtualmachine",
                    name,
                    &format!("{} does not support manual start requests", other.as_str()),
                ));
            }
        }
        Ok(accepted())
    }

    async fn stop(
        &self,
        st: &AppState,
        ns: &str,
        name: &str,
        opts: StopOptions,
        dry_run: bool,
    ) -> ApiResult<Response> {
        let vm = st.registry.get(vm_def(), ns, name).await?;
        let vmi = self.current_vmi(st, ns, name).await?;
        if let Some(g) = opts.grace_period
            && g < 0
        {
            return Err(ApiError::invalid(
                "StopOptions",
                "subresources.kubevirt.io",
                name,
                &[kubevirt_api::validation::FieldError::invalid(
                    "gracePeriod",
                    &g.to_string(),
                    "must be greater than or equal to 0",
                )],
            ));
        }
        let strategy = run_strategy(&vm)?;
        if let (Some(g), true) = (opts.grace_period, vmi.is_some()) {
            // A shorter grace period takes effect on the running instance first.
            self.set_vmi_grace(st, ns, name, g, dry_run).await?;
        }
        match strategy {
            RunStrategy::Halted => {
                if !vmi_running(vmi.as_ref()) || opts.grace_period.is_none() {
                    return Err(state_conflict("virtualmachine", name, "VM is not running"));
                }
            }
            RunStrategy::Always | RunStrategy::Once => {
                self.set_run_strategy(st, ns, name, dry_run, &vm, RunStrategy::Halted)
                    .await?;
            }
            RunStrategy::Manual | RunStrategy::RerunOnFailure | RunStrategy::WaitAsReceiver => {
                let Some(vmi) = vmi.filter(|v| vmi_running(Some(v))) else {
                    return Err(state_conflict("virtualmachine", name, "VM is not running"));
                };
                let uid = vmi.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
                self.push_requests(
                    st,
                    ns,
                    name,
                    dry_run,
                    vec![json!({"action": "Stop", "uid": uid})],
                )
                .await?;
            }
        }
        Ok(accepted())
    }

    async fn restart(
        &self,
        st: &AppState,
        ns: &str,
        name: &str,
        opts: RestartOptions,
        dry_run: bool,
    ) -> ApiResult<Response> {
        if let Some(g) = opts.grace_period_seconds
            && g != 0
        {
            return Err(ApiError::bad_request(
                "For force restart, only gracePeriod=0 is supported for now",
            ));
        }
        let vm = st.registry.get(vm_def(), ns, name).await?;
        match run_strategy(&vm)? {
            s @ (RunStrategy::Halted | RunStrategy::Once) => {
                return Err(state_conflict(
                    "virtualmachine",
                    name,
                    &format!("{} does not support manual restart requests", s.as_str()),
                ));
            }
            RunStrategy::Always
            | RunStrategy::RerunOnFailure
            | RunStrategy::Manual
            | RunStrategy::WaitAsReceiver => {}
        }
        let Some(vmi) = self
            .current_vmi(st, ns, name)
            .await?
            .filter(|v| vmi_running(Some(v)))
        else {
            return Err(state_conflict("virtualmachine", name, "VM is not running"));
        };
        if opts.grace_period_seconds == Some(0) {
            // Forced restart: the instance gets (almost) no time to shut down.
            self.set_vmi_grace(st, ns, name, 1, dry_run).await?;
        }
        let uid = vmi.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
        self.push_requests(
            st,
            ns,
            name,
            dry_run,
            vec![
                json!({"action": "Stop", "uid": uid}),
                json!({"action": "Start"}),
            ],
        )
        .await?;
        Ok(accepted())
    }

    async fn migrate(
        &self,
        st: &AppState,
        ns: &str,
        name: &str,
        opts: MigrateOptions,
        dry_run: bool,
    ) -> ApiResult<Response> {
        st.registry.get(vm_def(), ns, name).await?;
        let vmi = self.current_vmi(st, ns, name).await?;
        let status = vmi
            .map(typed_vmi)
            .transpose()?
            .and_then(|v| v.status)
            .filter(|s| s.phase == Phase::Running);
        let Some(status) = status else {
            return Err(state_conflict("virtualmachine", name, "VM is not running"));
        };
        let migratable = status.condition(condition_types::LIVE_MIGRATABLE);
        if let Some(c) = migratable.filter(|c| c.status == ConditionStatus::False) {
            let why = c
                .message
                .as_deref()
                .unwrap_or("the VMI is not live-migratable");
            return Err(state_conflict(
                "virtualmachine",
                name,
                &format!("VMI is not migratable: {why}"),
            ));
        }
        let mut spec = json!({"vmiName": name});
        if let Some(sel) = opts.added_node_selector {
            spec["addedNodeSelector"] = json!(sel);
        }
        let body = json!({"apiVersion": crate::rest::API_VERSION, "kind": "VirtualMachineInstanceMigration",
            "metadata": {"generateName": "kubevirt-migrate-vm-", "labels": {(kubevirt_api::migration::names::VMI_NAME_LABEL): name}}, "spec": spec});
        // The label naming the VMI is reserved: virt-apiserver writes it, not the caller.
        let wopts = WriteOptions {
            dry_run,
            field_manager: MANAGER.into(),
            actor: kubevirt_api::policy::Actor::Server,
            ..Default::default()
        };
        st.registry.create(vmim_def(), ns, body, &wopts).await?;
        Ok(accepted())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    /// Every subresource of the catalogue (what discovery, OpenAPI and the RBAC roles
    /// advertise) has a handler of its style: one without would answer 404 to every request.
    #[test]
    fn every_catalogued_subresource_has_a_handler() {
        for sub in catalogue::SUBRESOURCES {
            let r = route(sub);
            assert!(
                r.is_some_and(|r| (r == Route::VmiStream) == sub.is_stream()
                    && matches!(r, Route::VmiRead | Route::ExpandSpec) == sub.is_read()),
                "{} is catalogued as {:?} but served as {r:?}",
                sub.resource(),
                sub.style
            );
            assert!(ResourceDef::by_plural(sub.kind.plural).is_some());
        }
    }

    #[test]
    fn portforward_paths_name_a_port_and_a_protocol() {
        let path = |sub, rest: &[&str]| {
            stream_path(sub, &rest.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        let pf = &catalogue::PORTFORWARD_VMI;
        assert_eq!(path(pf, &["22"]).unwrap(), "portforward/22/tcp");
        assert_eq!(path(pf, &["8080", "tcp"]).unwrap(), "portforward/8080/tcp");
        assert_eq!(path(pf, &["53", "udp"]).unwrap(), "portforward/53/udp");
        for bad in [
            &["0"][..],
            &["65536"],
            &["ssh"],
            &[],
            &["22", "sctp"],
            &["22", "UDP"],
        ] {
            let e = path(pf, bad).unwrap_err();
            assert_eq!(e.code, 400, "{bad:?}: {}", e.message);
        }
        assert!(
            path(pf, &["22", "sctp"])
                .unwrap_err()
                .message
                .contains("sctp")
        );
        assert_eq!(path(&catalogue::CONSOLE, &[]).unwrap(), "console");
        assert_eq!(path(&catalogue::CONSOLE, &["x"]).unwrap_err().code, 404);
    }

    /// The OpenAPI document of subresources.kubevirt.io describes exactly the catalogue's
    /// subresources and administrative endpoints, each with the catalogue's method.
    #[test]
    fn every_subresource_in_openapi_has_a_handler() {
        let doc = virt_apimachinery::openapi::openapi_v3_group_version(
            virt_apimachinery::openapi::V3_SUBRESOURCES,
        )
        .expect("the subresources document");
        let prefix = "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/";
        // The operations of a path item: its methods, without the shared parameters.
        let methods = |item: &Value| -> Vec<String> {
            let mut m: Vec<String> = item
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, _)| k.to_uppercase())
                .filter(|k| k != "PARAMETERS")
                .collect();
            m.sort();
            m
        };
        let mut checked = 0;
        let mut admin = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            let Some(rest) = path.strip_prefix(prefix) else {
                let name = path.rsplit('/').next().unwrap_or_default();
                let endpoint = catalogue::admin_endpoint(name)
                    .unwrap_or_else(|| panic!("{path} is in OpenAPI but not in the catalogue"));
                assert_eq!(*path, endpoint.path());
                assert_eq!(methods(item), [endpoint.http_method], "{path}");
                admin.push(name);
                continue;
            };
            let parts: Vec<&str> = rest.split('/').collect();
            let [plural, "{name}", sub, ref params @ ..] = parts[..] else {
                panic!("unexpected subresource path {path}");
            };
            let entry = catalogue::subresource(plural, sub)
                .unwrap_or_else(|| panic!("{path} is in OpenAPI but not in the catalogue"));
            // A fixed suffix (`evacuate/cancel`) is part of the path, not a parameter.
            let params = match (entry.suffix, params) {
                ("", p) => p,
                (s, [first, p @ ..]) if *first == s => p,
                _ => panic!("{path} lacks the suffix {:?}", entry.suffix),
            };
            assert!(route(entry).is_some(), "{path} has no handler");
            assert_eq!(methods(item), [entry.http_method()], "{path}");
            // Path parameters as the catalogue names them, each optional from the right.
            let want: Vec<String> = entry.path_params[..params.len()]
                .iter()
                .map(|(p, _)| format!("{{{p}}}"))
                .collect();
            assert_eq!(params, want, "{path}");
            checked += 1;
        }
        let expected: usize = catalogue::SUBRESOURCES
            .iter()
            .map(|s| s.path_params.len().max(1))
            .sum();
        assert_eq!(
            checked, expected,
            "OpenAPI describes {checked} subresource paths"
        );
        admin.sort();
        let mut want: Vec<&str> = catalogue::ADMIN_ENDPOINTS.iter().map(|e| e.name).collect();
        want.sort();
        assert_eq!(admin, want, "administrative endpoints in OpenAPI");
    }
}
