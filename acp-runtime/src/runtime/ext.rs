//! The `_sandboxagent/*` methods
//! (research/contract.md, "Extension methods and control plane"), hosted in a
//! `jsonrpsee` `RpcModule`: method dispatch, params parsing and JSON-RPC
//! error objects come from the library, and the `methods` list advertised in
//! `initialize` is read from the module, so it names exactly what is answered.
//!
//! The module is called in-process with a placeholder id; the caller puts the
//! client's own id (raw JSON) on the answer, so ids round-trip exactly.
//!
//! Two tables: with the process API and without it (`--no-processes`), so
//! a server without it neither lists `_sandboxagent/process/*` nor answers
//! them (`-32601`, as any method it does not have).

use crate::protocol::{self, Envelope, RpcError, code};
use crate::runtime::Runtime;
use crate::state::connection::Connection;
use crate::state::session::MAX_METADATA_BYTES;
use ext_methods::{
    AgentInstallRequest, AgentListResult, AttachParams, FsDeleteParams, FsMoveParams, FsPathParams,
    ListModelsParams, ProcessInputParams, ProcessListParams, ProcessRef, ProcessRequest,
    ProcessResizeParams, ProcessSignalParams, SessionRef, SetMetadataParams, method,
};
use jsonrpsee::types::{ErrorObjectOwned, Params};
use jsonrpsee::{Extensions, Methods, RpcModule};
use serde::Serialize;
use serde_json::value::RawValue;
use std::sync::{Arc, OnceLock};

/// The connection a call came from and the runtime it is served by
/// (per-call `Extensions` entry): the method table holds no runtime.
#[derive(Clone)]
struct Caller {
    runtime: Arc<Runtime>,
    connection: Arc<Connection>,
}

/// Nothing: everything a method needs comes with the call ([`Caller`]).
type Context = ();
type MethodResult = Result<serde_json::Value, ErrorObjectOwned>;

/// The methods a server answers, registered once: with the process API's
/// (`processes`) or without them.
fn methods(processes: bool) -> &'static Methods {
    static WITH_PROCESSES: OnceLock<Methods> = OnceLock::new();
    static WITHOUT_PROCESSES: OnceLock<Methods> = OnceLock::new();
    if processes {
        WITH_PROCESSES.get_or_init(|| register(true))
    } else {
        WITHOUT_PROCESSES.get_or_init(|| register(false))
    }
}

/// Registers every method (the process API's when `processes`).
fn register(processes: bool) -> Methods {
    let mut module = RpcModule::new(());
    let registered = [
        module
            .register_async_method(method::SESSION_ATTACH, attach)
            .map(drop),
        module
            .register_method(method::SESSION_DETACH, detach)
            .map(drop),
        module
            .register_async_method(method::SESSION_TERMINATE, terminate)
            .map(drop),
        module
            .register_method(method::SESSION_LIST_MODELS, list_models)
            .map(drop),
        module
            .register_method(method::SESSION_SET_METADATA, set_metadata)
            .map(drop),
        module.register_method(method::SESSION_GET, get).map(drop),
        module
            .register_method(method::AGENT_LIST, agent_list)
            .map(drop),
        module
            .register_async_method(method::SESSION_LIST, session_list)
            .map(drop),
        module
            .register_async_method(method::AGENT_INSTALL, agent_install)
            .map(drop),
        module
            .register_async_method(method::FS_LIST_ENTRIES, fs_list_entries)
            .map(drop),
        module
            .register_async_method(method::FS_STAT, fs_stat)
            .map(drop),
        module
            .register_async_method(method::FS_MKDIR, fs_mkdir)
            .map(drop),
        module
            .register_async_method(method::FS_MOVE, fs_move)
            .map(drop),
        module
            .register_async_method(method::FS_DELETE_ENTRY, fs_delete_entry)
            .map(drop),
    ];
    let process_methods = processes.then(|| {
        [
            module
                .register_async_method(method::PROCESS_RUN, process_run)
                .map(drop),
            module
                .register_async_method(method::PROCESS_START, process_start)
                .map(drop),
            module
                .register_method(method::PROCESS_LIST, process_list)
                .map(drop),
            module
                .register_method(method::PROCESS_GET, process_get)
                .map(drop),
            module
                .register_async_method(method::PROCESS_SIGNAL, process_signal)
                .map(drop),
            module
                .register_async_method(method::PROCESS_INPUT, process_input)
                .map(drop),
            module
                .register_async_method(method::PROCESS_RESIZE, process_resize)
                .map(drop),
        ]
    });
    for result in registered
        .into_iter()
        .chain(process_methods.into_iter().flatten())
    {
        if let Err(error) = result {
            tracing::error!(%error, "extension method registered twice");
        }
    }
    module.into()
}

/// Names of the methods `runtime` answers, for the `initialize`
/// advertisement.
pub fn names(runtime: &Runtime) -> impl Iterator<Item = &'static str> {
    methods(runtime.processes.is_some()).method_names()
}

/// Whether `runtime` answers `method` here.
pub fn answers(runtime: &Runtime, method: &str) -> bool {
    methods(runtime.processes.is_some())
        .method(method)
        .is_some()
}

/// Calls `method` for `connection` on `runtime`. `Ok`: the raw result;
/// `Err`: the raw JSON-RPC error object (unknown method, invalid params, …).
pub async fn call(
    runtime: &Arc<Runtime>,
    connection: &Arc<Connection>,
    method: &str,
    params: Option<&RawValue>,
) -> Result<Box<RawValue>, Box<RawValue>> {
    let request = protocol::agent_request_line(0, method, params);
    let mut methods = methods(runtime.processes.is_some()).clone();
    methods.extensions_mut().insert(Caller {
        runtime: runtime.clone(),
        connection: connection.clone(),
    });
    let internal =
        |message: String| Err(protocol::raw(&RpcError::new(code::INTERNAL_ERROR, message)));
    let Ok(request) = std::str::from_utf8(&request) else {
        return internal("request is not UTF-8".to_owned());
    };
    let response = match methods.raw_json_request(request, 1).await {
        Ok((response, _subscriptions)) => response,
        Err(error) => return internal(error.to_string()),
    };
    match Envelope::parse(response.get().as_bytes(), false) {
        Ok((envelope, _)) => match (envelope.result, envelope.error) {
            (Some(result), _) => Ok(result.to_owned()),
            (None, Some(error)) => Err(error.to_owned()),
            (None, None) => internal("empty answer".to_owned()),
        },
        Err(error) => internal(error.to_string()),
    }
}

impl From<RpcError> for ErrorObjectOwned {
    fn from(error: RpcError) -> Self {
        let code = i32::try_from(error.code).unwrap_or(code::INTERNAL_ERROR as i32);
        ErrorObjectOwned::owned(code, error.message, error.data)
    }
}

fn runtime(extensions: &Extensions) -> Result<Arc<Runtime>, ErrorObjectOwned> {
    extensions
        .get::<Caller>()
        .map(|caller| caller.runtime.clone())
        .ok_or_else(|| RpcError::new(code::INTERNAL_ERROR, "no runtime").into())
}

fn caller(extensions: &Extensions) -> Result<Arc<Connection>, ErrorObjectOwned> {
    extensions
        .get::<Caller>()
        .map(|caller| caller.connection.clone())
        .ok_or_else(|| RpcError::new(code::INTERNAL_ERROR, "no calling connection").into())
}

fn invalid_params(message: impl Into<String>) -> ErrorObjectOwned {
    RpcError::new(code::INVALID_PARAMS, message).into()
}

fn to_value(value: impl Serialize) -> MethodResult {
    serde_json::to_value(value)
        .map_err(|error| RpcError::new(code::INTERNAL_ERROR, error.to_string()).into())
}

/// `_sandboxagent/session/attach {sessionId, role?, historyPolicy?}` →
/// `AttachResult` (research/contract.md, "`_sandboxagent/session/attach`").
async fn attach(params: Params<'static>, _: Arc<Context>, extensions: Extensions) -> MethodResult {
    let params: AttachParams = params.parse()?;
    let runtime = runtime(&extensions)?;
    let caller = caller(&extensions)?;
    to_value(
        runtime
            .attach_session(
                &caller,
                &params.session_id,
                params.role,
                params.history_policy,
            )
            .await?,
    )
}

/// `_sandboxagent/session/detach {sessionId}` → `{}`.
fn detach(params: Params<'_>, _: &Context, extensions: &Extensions) -> MethodResult {
    let SessionRef { session_id } = params.parse()?;
    let runtime = runtime(extensions)?;
    let caller = caller(extensions)?;
    let session = runtime.session_or_error(&caller.agent, &session_id)?;
    session.detach(&caller);
    Ok(serde_json::json!({}))
}

/// `_sandboxagent/session/terminate {sessionId}` → `TerminateResult`.
async fn terminate(
    params: Params<'static>,
    _: Arc<Context>,
    extensions: Extensions,
) -> MethodResult {
    let SessionRef { session_id } = params.parse()?;
    let runtime = runtime(&extensions)?;
    let caller = caller(&extensions)?;
    to_value(
        runtime
            .terminate_session(&caller.agent, &session_id)
            .await?,
    )
}

/// `_sandboxagent/session/list_models {sessionId | agent}` → `ListModelsResult`.
fn list_models(params: Params<'_>, _: &Context, extensions: &Extensions) -> MethodResult {
    let params: ListModelsParams = params.parse()?;
    let target = params.target().map_err(|e| invalid_params(e.0))?;
    let caller = caller(extensions)?;
    to_value(runtime(extensions)?.list_models(&caller.agent, target)?)
}

/// `_sandboxagent/session/set_metadata` (either params form) → the updated entry.
fn set_metadata(params: Params<'_>, _: &Context, extensions: &Extensions) -> MethodResult {
    let params: SetMetadataParams = params.parse()?;
    let (session_id, patch) = params.into_patch().map_err(|e| invalid_params(e.0))?;
    let caller = caller(extensions)?;
    let session = runtime(extensions)?.session_or_error(&caller.agent, &session_id)?;
    session.try_apply_metadata(&patch).map_err(|size| {
        invalid_params(format!(
            "the session's metadata would be {size} bytes; at most {MAX_METADATA_BYTES} are kept"
        ))
    })?;
    to_value(session.info())
}

/// `_sandboxagent/session/get {sessionId}` → one entry.
fn get(params: Params<'_>, _: &Context, extensions: &Extensions) -> MethodResult {
    let SessionRef { session_id } = params.parse()?;
    let caller = caller(extensions)?;
    to_value(
        runtime(extensions)?
            .session_or_error(&caller.agent, &session_id)?
            .info(),
    )
}

/// `_sandboxagent/agent/list` → `AgentListResult`.
fn agent_list(_: Params<'_>, _: &Context, extensions: &Extensions) -> MethodResult {
    to_value(AgentListResult {
        agents: runtime(extensions)?.agents.infos(),
    })
}

/// `_sandboxagent/session/list` (the seed-era name of `session/list`) →
/// ACP `ListSessionsResponse`, the same page `session/list` gives.
async fn session_list(
    params: Params<'static>,
    _: Arc<Context>,
    extensions: Extensions,
) -> MethodResult {
    let raw = params
        .as_str()
        .map(serde_json::from_str::<&RawValue>)
        .transpose()
        .map_err(|error| invalid_params(format!("invalid params: {error}")))?;
    to_value(runtime(&extensions)?.list_sessions(raw).await?)
}

/// `_sandboxagent/agent/install {agent, version?, reinstall?}` →
/// `AgentInstallResult`, as `POST /v2/agents/{agent}/install`; a failure is
/// the same problem as there, as a JSON-RPC error (`data.type`).
async fn agent_install(
    params: Params<'static>,
    _: Arc<Context>,
    extensions: Extensions,
) -> MethodResult {
    let request: AgentInstallRequest = params.parse()?;
    let runtime = runtime(&extensions)?;
    let installed = runtime
        .install_agent(&request.agent, request.options)
        .await
        .map_err(|error| ErrorObjectOwned::from(error.to_rpc_error()))?;
    to_value(installed)
}

/// Runs one file system operation for a `_sandboxagent/fs/*` call: the
/// scope of `session` (the caller's agent's session first), the blocking
/// call on the blocking pool, and a failure as the same problem as on
/// `/v2/fs/*`, as a JSON-RPC error (`data.type`; research/contract.md,
/// "Host file system").
async fn fs_call<T: Serialize + Send + 'static>(
    extensions: &Extensions,
    session: Option<&str>,
    call: impl FnOnce(&crate::fs::Scope) -> Result<T, crate::error::Error> + Send + 'static,
) -> MethodResult {
    let runtime = runtime(extensions)?;
    let caller = caller(extensions)?;
    let rpc = |error: crate::error::Error| ErrorObjectOwned::from(error.to_rpc_error());
    let scope = runtime
        .fs_scope(session, Some(&caller.agent))
        .map_err(rpc)?;
    let answer = tokio::task::spawn_blocking(move || call(&scope))
        .await
        .map_err(|error| RpcError::new(code::INTERNAL_ERROR, error.to_string()))?
        .map_err(rpc)?;
    to_value(answer)
}

/// `_sandboxagent/fs/list_entries {path?, sessionId?}` → `FsEntries`.
async fn fs_list_entries(
    params: Params<'static>,
    _: Arc<Context>,
    extensions: Extensions,
) -> MethodResult {
    let params: FsPathParams = optional_params(&params)?;
    fs_call(&extensions, params.session_id.as_deref(), move |scope| {
        crate::fs::ops::list(scope, params.path.as_deref())
    })
    .await
}

/// `_sandboxagent/fs/stat {path, sessionId?}` → `FsEntry`.
async fn fs_stat(params: Params<'static>, _: Arc<Context>, extensions: Extensions) -> MethodResult {
    let params: FsPathParams = params.parse()?;
    let path = required_path(&params)?;
    fs_call(&extensions, params.session_id.as_deref(), move |scope| {
        crate::fs::ops::stat(scope, &path)
    })
    .await
}

/// `_sandboxagent/fs/mkdir {path, sessionId?}` → `{path}`.
async fn fs_mkdir(
    params: Params<'static>,
    _: Arc<Context>,
    extensions: Extensions,
) -> MethodResult {
    let params: FsPathParams = params.parse()?;
    let path = required_path(&params)?;
    fs_call(&extensions, params.session_id.as_deref(), move |scope| {
        crate::fs::ops::mkdir(scope, &path)
    })
    .await
}

/// `_sandboxagent/fs/move {from, to, overwrite?, sessionId?}` → `{from, to}`.
async fn fs_move(params: Params<'static>, _: Arc<Context>, extensions: Extensions) -> MethodResult {
    let params: FsMoveParams = params.parse()?;
    let session = params.session_id.clone();
    fs_call(&extensions, session.as_deref(), move |scope| {
        crate::fs::ops::rename(scope, &params)
    })
    .await
}

/// `_sandboxagent/fs/delete_entry {path, recursive?, sessionId?}` → `{path}`.
async fn fs_delete_entry(
    params: Params<'static>,
    _: Arc<Context>,
    extensions: Extensions,
) -> MethodResult {
    let params: FsDeleteParams = params.parse()?;
    let session = params.session_id.clone();
    fs_call(&extensions, session.as_deref(), move |scope| {
        crate::fs::ops::delete(scope, &params)
    })
    .await
}

/// Params that may be left out entirely (`list_entries` without any).
fn optional_params<T: serde::de::DeserializeOwned + Default>(
    params: &Params<'_>,
) -> Result<T, ErrorObjectOwned> {
    if params
        .as_str()
        .is_none_or(|raw| raw.trim().is_empty() || raw.trim() == "null")
    {
        return Ok(T::default());
    }
    params.parse()
}

/// The `path` param, required by every method but `list_entries`.
fn required_path(params: &FsPathParams) -> Result<String, ErrorObjectOwned> {
    params
        .path
        .clone()
        .ok_or_else(|| crate::error::Error::InvalidPath("params.path is required".to_owned()))
        .map_err(|error| ErrorObjectOwned::from(error.to_rpc_error()))
}

/// A process API failure as the same problem as on `/v2/processes…`, as a
/// JSON-RPC error (`data.type`, `data.status`; research/contract.md,
/// "Processes and terminals").
fn problem(error: crate::error::Error) -> ErrorObjectOwned {
    ErrorObjectOwned::from(error.to_rpc_error())
}

/// `_sandboxagent/process/run` `ProcessRequest` → `RunResult`, as
/// `POST /v2/processes/run`.
async fn process_run(
    params: Params<'static>,
    _: Arc<Context>,
    extensions: Extensions,
) -> MethodResult {
    let request: ProcessRequest = params.parse()?;
    to_value(
        runtime(&extensions)?
            .run_process(request)
            .await
            .map_err(problem)?,
    )
}

/// `_sandboxagent/process/start` `ProcessRequest` → `ProcessInfo`, as
/// `POST /v2/processes`.
async fn process_start(
    params: Params<'static>,
    _: Arc<Context>,
    extensions: Extensions,
) -> MethodResult {
    let request: ProcessRequest = params.parse()?;
    let process = runtime(&extensions)?
        .start_process(request)
        .await
        .map_err(problem)?;
    to_value(process.info())
}

/// `_sandboxagent/process/list {limit?, cursor?, sessionId?, state?}` →
/// `ProcessPage`, as `GET /v2/processes`.
fn process_list(params: Params<'_>, _: &Context, extensions: &Extensions) -> MethodResult {
    let params: ProcessListParams = optional_params(&params)?;
    to_value(
        runtime(extensions)?
            .list_processes(&params)
            .map_err(problem)?,
    )
}

/// `_sandboxagent/process/get {processId}` → `ProcessInfo`.
fn process_get(params: Params<'_>, _: &Context, extensions: &Extensions) -> MethodResult {
    let ProcessRef { process_id } = params.parse()?;
    to_value(
        runtime(extensions)?
            .process(&process_id)
            .map_err(problem)?
            .info(),
    )
}

/// `_sandboxagent/process/signal {processId, signal}` → `{}`.
async fn process_signal(
    params: Params<'static>,
    _: Arc<Context>,
    extensions: Extensions,
) -> MethodResult {
    let params: ProcessSignalParams = params.parse()?;
    let runtime = runtime(&extensions)?;
    let process = runtime.process(&params.process_id).map_err(problem)?;
    runtime
        .signal_process(&process, &params.signal)
        .await
        .map_err(problem)?;
    Ok(serde_json::json!({}))
}

/// `_sandboxagent/process/input {processId, data?, encoding?, eof?}` → `{}`.
/// At most the server's body limit of bytes, as the route's raw body.
async fn process_input(
    params: Params<'static>,
    _: Arc<Context>,
    extensions: Extensions,
) -> MethodResult {
    let params: ProcessInputParams = params.parse()?;
    let bytes = params
        .bytes()
        .map_err(|error| invalid_params(error.to_string()))?;
    let runtime = runtime(&extensions)?;
    let process = runtime.process(&params.process_id).map_err(problem)?;
    runtime
        .write_process_input(&process, bytes.into(), params.eof)
        .await
        .map_err(problem)?;
    Ok(serde_json::json!({}))
}

/// `_sandboxagent/process/resize {processId, cols, rows}` → `{}`.
async fn process_resize(
    params: Params<'static>,
    _: Arc<Context>,
    extensions: Extensions,
) -> MethodResult {
    let params: ProcessResizeParams = params.parse()?;
    let runtime = runtime(&extensions)?;
    let process = runtime.process(&params.process_id).map_err(problem)?;
    runtime
        .resize_process(&process, params.cols, params.rows)
        .await
        .map_err(problem)?;
    Ok(serde_json::json!({}))
}
