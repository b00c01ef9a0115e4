//! The `_sandboxagent/*` methods (research/contract.md, "Extension methods
//! and control plane"), answered from one table, [`HANDLERS`]: each entry
//! pairs a method's wire facts ([`ExtMethod`]: name, capability key,
//! notification flag, defined in `ext-methods`, which the SDK reads too) with
//! the function that answers it. The dispatcher ([`call`], [`answers`]) and
//! the `methods` list advertised in `initialize` ([`names`]) read the same
//! table, so the list names exactly what is answered; unit tests hold the
//! table to `ext_methods::METHODS`, entry for entry, and to
//! research/contract.md, which describes every method in it.
//!
//! A handler gets the params as the client wrote them, borrowed from the
//! bytes the edge parsed once, deserializes its typed params from them, and
//! its result is serialized once, into the raw value the response line
//! carries: no second parse, no `serde_json::Value` in between.
//!
//! With the process API off (`--no-processes`) its entries are left out: the
//! server neither lists `_sandboxagent/process/*` nor answers them (`-32601`,
//! as any method it does not have).
//!
//! The error objects for a method not answered and for params that do not
//! deserialize are the ones clients have seen from the first release (the
//! `jsonrpsee` texts): `{"code":-32601,"message":"Method not found"}` and
//! `{"code":-32602,"message":"Invalid params","data":"<serde's message>"}`,
//! absent params read as `null`.

use crate::memory::connection::Connection;
use crate::memory::session::MAX_METADATA_BYTES;
use crate::protocol::{self, RpcError, code};
use crate::runtime::Runtime;
use ext_methods::{
    AgentInstallRequest, AgentListResult, AttachParams, ExtMethod, FsDeleteParams, FsMoveParams,
    FsPathParams, ListModelsParams, METHODS, ProcessInputParams, ProcessListParams, ProcessRef,
    ProcessRequest, ProcessResizeParams, ProcessSignalParams, SessionRef, SetMetadataParams,
    method,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Every extension method the runtime answers, in the order of
/// `ext_methods::METHODS`. An entry naming a method `METHODS` does not have
/// does not compile ([`ext`]); one missing fails the unit test
/// `every_method_has_one_handler`.
static HANDLERS: [Handler; 21] = [
    Handler::later(method::SESSION_ATTACH, attach),
    Handler::now(method::SESSION_DETACH, detach),
    Handler::later(method::SESSION_TERMINATE, terminate),
    Handler::now(method::SESSION_LIST_MODELS, list_models),
    Handler::now(method::SESSION_SET_METADATA, set_metadata),
    Handler::now(method::SESSION_GET, get),
    Handler::now(method::AGENT_LIST, agent_list),
    Handler::later(method::SESSION_LIST, session_list),
    Handler::later(method::AGENT_INSTALL, agent_install),
    Handler::later(method::FS_LIST_ENTRIES, fs_list_entries),
    Handler::later(method::FS_STAT, fs_stat),
    Handler::later(method::FS_MKDIR, fs_mkdir),
    Handler::later(method::FS_MOVE, fs_move),
    Handler::later(method::FS_DELETE_ENTRY, fs_delete_entry),
    Handler::later(method::PROCESS_RUN, process_run).process_api(),
    Handler::later(method::PROCESS_START, process_start).process_api(),
    Handler::now(method::PROCESS_LIST, process_list).process_api(),
    Handler::now(method::PROCESS_GET, process_get).process_api(),
    Handler::later(method::PROCESS_SIGNAL, process_signal).process_api(),
    Handler::later(method::PROCESS_INPUT, process_input).process_api(),
    Handler::later(method::PROCESS_RESIZE, process_resize).process_api(),
];

/// One extension method the runtime answers: its wire facts and the
/// function answering it.
struct Handler {
    /// Name, capability key and notification flag, shared with the SDK.
    method: &'static ExtMethod,
    /// Part of the process API: left out with `--no-processes`.
    process_api: bool,
    /// The function answering it.
    run: Run,
}

/// How a handler answers: at once, or after awaiting something (the
/// store, an agent, a process, the blocking pool).
#[derive(Clone, Copy)]
enum Run {
    Now(fn(Call<'_>) -> Answer),
    Later(fn(Call<'_>) -> Pending<'_>),
}

/// What a handler is called with.
#[derive(Clone, Copy)]
struct Call<'a> {
    runtime: &'a Arc<Runtime>,
    /// The connection the call came on (its agent scopes session lookups).
    connection: &'a Arc<Connection>,
    /// The params as written; `None` when absent (the envelope admits
    /// only an object).
    params: Option<&'a RawValue>,
}

/// A handler's answer: its result, serialized once, or the error object.
type Answer = Result<Box<RawValue>, RpcError>;

/// The answer of a handler that awaits.
type Pending<'a> = Pin<Box<dyn Future<Output = Answer> + Send + 'a>>;

impl Handler {
    /// `name`'s entry, answered at once.
    const fn now(name: &str, run: fn(Call<'_>) -> Answer) -> Self {
        Self {
            method: ext(name),
            process_api: false,
            run: Run::Now(run),
        }
    }

    /// `name`'s entry, answered by awaiting `run`.
    const fn later(name: &str, run: fn(Call<'_>) -> Pending<'_>) -> Self {
        Self {
            method: ext(name),
            process_api: false,
            run: Run::Later(run),
        }
    }

    /// The same entry, part of the process API.
    const fn process_api(self) -> Self {
        Self {
            process_api: true,
            ..self
        }
    }
}

/// The `METHODS` entry named `name`; evaluated while compiling
/// [`HANDLERS`], so a name with no entry is a compile error.
const fn ext(name: &str) -> &'static ExtMethod {
    let mut at = 0;
    while at < METHODS.len() {
        if same(METHODS[at].name.as_bytes(), name.as_bytes()) {
            return &METHODS[at];
        }
        at += 1;
    }
    panic!("a handler names a method that ext_methods::METHODS does not have")
}

/// `a == b`, in a `const fn`.
const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut at = 0;
    while at < a.len() {
        if a[at] != b[at] {
            return false;
        }
        at += 1;
    }
    true
}

/// The entries `runtime` answers (without the process API's when it has
/// none).
fn handlers(runtime: &Runtime) -> impl Iterator<Item = &'static Handler> {
    let processes = runtime.processes.is_some();
    HANDLERS
        .iter()
        .filter(move |handler| processes || !handler.process_api)
}

/// `runtime`'s entry for `method`, if it answers it.
fn handler(runtime: &Runtime, method: &str) -> Option<&'static Handler> {
    handlers(runtime).find(|handler| handler.method.name == method)
}

/// Names of the methods `runtime` answers, for the `initialize`
/// advertisement.
pub fn names(runtime: &Runtime) -> impl Iterator<Item = &'static str> {
    handlers(runtime).map(|handler| handler.method.name)
}

/// Whether `runtime` answers `method` here.
pub fn answers(runtime: &Runtime, method: &str) -> bool {
    handler(runtime, method).is_some()
}

/// Calls `method` for `connection` on `runtime` with `params` as the client
/// wrote them. `Ok`: the raw result; `Err`: the raw JSON-RPC error object
/// (`-32601` for a method `runtime` does not answer, `-32602` for params
/// that do not deserialize, the method's own errors).
pub async fn call(
    runtime: &Arc<Runtime>,
    connection: &Arc<Connection>,
    method: &str,
    params: Option<&RawValue>,
) -> Result<Box<RawValue>, Box<RawValue>> {
    let Some(handler) = handler(runtime, method) else {
        return Err(protocol::raw(&RpcError::new(
            code::METHOD_NOT_FOUND,
            "Method not found",
        )));
    };
    // `params` is an object or absent: the envelope refuses any other
    // (research/contract.md, "Transport: /v2/rpc").
    let call = Call {
        runtime,
        connection,
        params,
    };
    let answer = match handler.run {
        Run::Now(run) => run(call),
        Run::Later(run) => run(call).await,
    };
    answer.map_err(|error| protocol::raw(&error))
}

impl Call<'_> {
    /// The params as `T`; absent params are read as `null`.
    ///
    /// # Errors
    /// `-32602 "Invalid params"` with serde's message as `data`.
    fn params<T: DeserializeOwned>(&self) -> Result<T, RpcError> {
        typed(self.params)
    }

    /// Params that may be left out entirely (`T::default()` then).
    ///
    /// # Errors
    /// As [`Call::params`].
    fn optional_params<T: DeserializeOwned + Default>(&self) -> Result<T, RpcError> {
        match self.params {
            None => Ok(T::default()),
            Some(_) => self.params(),
        }
    }
}

/// `params` (`None`: `null`) as `T`.
///
/// # Errors
/// `-32602 "Invalid params"` with serde's message as `data`.
fn typed<T: DeserializeOwned>(params: Option<&RawValue>) -> Result<T, RpcError> {
    serde_json::from_str(params.map_or("null", RawValue::get)).map_err(|error| {
        RpcError::new(code::INVALID_PARAMS, "Invalid params")
            .with_data(serde_json::Value::String(error.to_string()))
    })
}

/// `value` serialized once, as the result.
fn answer(value: &impl Serialize) -> Answer {
    serde_json::value::to_raw_value(value)
        .map_err(|error| RpcError::new(code::INTERNAL_ERROR, error.to_string()))
}

/// The result `{}`.
fn empty() -> Answer {
    answer(&serde_json::Map::new())
}

fn invalid_params(message: impl Into<String>) -> RpcError {
    RpcError::new(code::INVALID_PARAMS, message)
}

/// A failure of a service shared with an HTTP route, as the same problem
/// as there, as a JSON-RPC error (`data.type`, `data.status`;
/// research/contract.md, "Host file system" and "Processes and terminals").
fn problem(error: crate::error::Error) -> RpcError {
    error.to_rpc_error()
}

/// `_sandboxagent/session/attach {sessionId, role?, historyPolicy?}` →
/// `AttachResult` (research/contract.md, "`_sandboxagent/session/attach`").
fn attach(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let params: AttachParams = call.params()?;
        let attached = call
            .runtime
            .attach_session(
                call.connection,
                &params.session_id,
                params.role,
                params.history_policy,
            )
            .await?;
        answer(&attached)
    })
}

/// `_sandboxagent/session/detach {sessionId}` → `{}`.
fn detach(call: Call<'_>) -> Answer {
    let SessionRef { session_id } = call.params()?;
    let session = call
        .runtime
        .session_or_error(&call.connection.agent, &session_id)?;
    session.detach(call.connection);
    empty()
}

/// `_sandboxagent/session/terminate {sessionId}` → `TerminateResult`.
fn terminate(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let SessionRef { session_id } = call.params()?;
        let terminated = call
            .runtime
            .terminate_session(&call.connection.agent, &session_id)
            .await?;
        answer(&terminated)
    })
}

/// `_sandboxagent/session/list_models {sessionId | agent}` → `ListModelsResult`.
fn list_models(call: Call<'_>) -> Answer {
    let params: ListModelsParams = call.params()?;
    let target = params.target().map_err(|e| invalid_params(e.0))?;
    answer(&call.runtime.list_models(&call.connection.agent, target)?)
}

/// `_sandboxagent/session/set_metadata` (either params form) → the updated entry.
fn set_metadata(call: Call<'_>) -> Answer {
    let params: SetMetadataParams = call.params()?;
    let (session_id, patch) = params.into_patch().map_err(|e| invalid_params(e.0))?;
    let session = call
        .runtime
        .session_or_error(&call.connection.agent, &session_id)?;
    session.try_apply_metadata(&patch).map_err(|size| {
        invalid_params(format!(
            "the session's metadata would be {size} bytes; at most {MAX_METADATA_BYTES} are kept"
        ))
    })?;
    answer(&session.info())
}

/// `_sandboxagent/session/get {sessionId}` → one entry.
fn get(call: Call<'_>) -> Answer {
    let SessionRef { session_id } = call.params()?;
    let session = call
        .runtime
        .session_or_error(&call.connection.agent, &session_id)?;
    answer(&session.info())
}

/// `_sandboxagent/agent/list` (params ignored) → `AgentListResult`.
fn agent_list(call: Call<'_>) -> Answer {
    answer(&AgentListResult {
        agents: call.runtime.agents.infos(),
    })
}

/// `_sandboxagent/session/list` (the seed-era name of `session/list`) →
/// ACP `ListSessionsResponse`, the same page `session/list` gives.
fn session_list(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move { answer(&call.runtime.list_sessions(call.params).await?) })
}

/// `_sandboxagent/agent/install {agent, version?, reinstall?}` →
/// `AgentInstallResult`, as `POST /v2/agents/{agent}/install`; a failure is
/// the same problem as there, as a JSON-RPC error (`data.type`).
fn agent_install(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let request: AgentInstallRequest = call.params()?;
        let installed = call
            .runtime
            .install_agent(&request.agent, request.options)
            .await
            .map_err(|error| error.to_rpc_error())?;
        answer(&installed)
    })
}

/// Runs one file system operation for a `_sandboxagent/fs/*` call: the
/// scope of `session` (the caller's agent's session first), the blocking
/// call on the blocking pool, and a failure as the same problem as on
/// `/v2/fs/*`, as a JSON-RPC error (`data.type`; research/contract.md,
/// "Host file system").
async fn fs_call<T: Serialize + Send + 'static>(
    call: Call<'_>,
    session: Option<&str>,
    operation: impl FnOnce(&crate::fs::Scope) -> Result<T, crate::error::Error> + Send + 'static,
) -> Answer {
    let scope = call
        .runtime
        .fs_scope(session, Some(&call.connection.agent))
        .map_err(problem)?;
    let done = tokio::task::spawn_blocking(move || operation(&scope))
        .await
        .map_err(|error| RpcError::new(code::INTERNAL_ERROR, error.to_string()))?
        .map_err(problem)?;
    answer(&done)
}

/// `_sandboxagent/fs/list_entries {path?, sessionId?}` (params may be left
/// out) → `FsEntries`.
fn fs_list_entries(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let params: FsPathParams = call.optional_params()?;
        fs_call(call, params.session_id.as_deref(), move |scope| {
            crate::fs::ops::list(scope, params.path.as_deref())
        })
        .await
    })
}

/// `_sandboxagent/fs/stat {path, sessionId?}` → `FsEntry`.
fn fs_stat(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let params: FsPathParams = call.params()?;
        let path = required_path(&params)?;
        fs_call(call, params.session_id.as_deref(), move |scope| {
            crate::fs::ops::stat(scope, &path)
        })
        .await
    })
}

/// `_sandboxagent/fs/mkdir {path, sessionId?}` → `{path}`.
fn fs_mkdir(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let params: FsPathParams = call.params()?;
        let path = required_path(&params)?;
        fs_call(call, params.session_id.as_deref(), move |scope| {
            crate::fs::ops::mkdir(scope, &path)
        })
        .await
    })
}

/// `_sandboxagent/fs/move {from, to, overwrite?, sessionId?}` → `{from, to}`.
fn fs_move(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let params: FsMoveParams = call.params()?;
        let session = params.session_id.clone();
        fs_call(call, session.as_deref(), move |scope| {
            crate::fs::ops::rename(scope, &params)
        })
        .await
    })
}

/// `_sandboxagent/fs/delete_entry {path, recursive?, sessionId?}` → `{path}`.
fn fs_delete_entry(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let params: FsDeleteParams = call.params()?;
        let session = params.session_id.clone();
        fs_call(call, session.as_deref(), move |scope| {
            crate::fs::ops::delete(scope, &params)
        })
        .await
    })
}

/// The `path` param, required by every fs method but `list_entries`.
fn required_path(params: &FsPathParams) -> Result<String, RpcError> {
    params.path.clone().ok_or_else(|| {
        problem(crate::error::Error::InvalidPath(
            "params.path is required".to_owned(),
        ))
    })
}

/// `_sandboxagent/process/run` `ProcessRequest` → `RunResult`, as
/// `POST /v2/processes/run`.
fn process_run(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let request: ProcessRequest = call.params()?;
        answer(&call.runtime.run_process(request).await.map_err(problem)?)
    })
}

/// `_sandboxagent/process/start` `ProcessRequest` → `ProcessInfo`, as
/// `POST /v2/processes`.
fn process_start(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let request: ProcessRequest = call.params()?;
        let process = call.runtime.start_process(request).await.map_err(problem)?;
        answer(&process.info())
    })
}

/// `_sandboxagent/process/list {limit?, cursor?, sessionId?, state?}`
/// (params may be left out) → `ProcessPage`, as `GET /v2/processes`.
fn process_list(call: Call<'_>) -> Answer {
    let params: ProcessListParams = call.optional_params()?;
    answer(&call.runtime.list_processes(&params).map_err(problem)?)
}

/// `_sandboxagent/process/get {processId}` → `ProcessInfo`.
fn process_get(call: Call<'_>) -> Answer {
    let ProcessRef { process_id } = call.params()?;
    answer(&call.runtime.process(&process_id).map_err(problem)?.info())
}

/// `_sandboxagent/process/signal {processId, signal}` → `{}`.
fn process_signal(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let params: ProcessSignalParams = call.params()?;
        let process = call.runtime.process(&params.process_id).map_err(problem)?;
        call.runtime
            .signal_process(&process, &params.signal)
            .await
            .map_err(problem)?;
        empty()
    })
}

/// `_sandboxagent/process/input {processId, data?, encoding?, eof?}` → `{}`.
/// At most the server's body limit of bytes, as the route's raw body.
fn process_input(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let params: ProcessInputParams = call.params()?;
        let bytes = params
            .bytes()
            .map_err(|error| invalid_params(error.to_string()))?;
        let process = call.runtime.process(&params.process_id).map_err(problem)?;
        call.runtime
            .write_process_input(&process, bytes.into(), params.eof)
            .await
            .map_err(problem)?;
        empty()
    })
}

/// `_sandboxagent/process/resize {processId, cols, rows}` → `{}`.
fn process_resize(call: Call<'_>) -> Pending<'_> {
    Box::pin(async move {
        let params: ProcessResizeParams = call.params()?;
        let process = call.runtime.process(&params.process_id).map_err(problem)?;
        call.runtime
            .resize_process(&process, params.cols, params.rows)
            .await
            .map_err(problem)?;
        empty()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_has_one_handler() {
        for method in METHODS {
            let entries = HANDLERS
                .iter()
                .filter(|handler| handler.method.name == method.name)
                .count();
            assert_eq!(entries, 1, "{} has {entries} handlers", method.name);
        }
        for handler in &HANDLERS {
            assert_eq!(
                ext_methods::names::find(handler.method.name),
                Some(handler.method),
                "{} is not a METHODS entry",
                handler.method.name
            );
        }
    }

    /// research/contract.md describes every method the table answers.
    #[test]
    fn every_method_is_in_the_contract() {
        let contract = include_str!("../../../research/contract.md");
        for handler in &HANDLERS {
            let name = format!("`{}`", handler.method.name);
            assert!(
                contract.contains(&name),
                "{name} is not in research/contract.md"
            );
        }
    }

    #[test]
    fn the_process_api_is_the_process_methods() {
        for handler in &HANDLERS {
            assert_eq!(
                handler.process_api,
                handler.method.name.starts_with("_sandboxagent/process/"),
                "{}",
                handler.method.name
            );
        }
    }

    /// The error objects clients have seen since the first release.
    #[test]
    fn params_errors_keep_their_texts() {
        let raw = |text: &str| RawValue::from_string(text.to_owned()).ok();
        let error = |params: Option<Box<RawValue>>| {
            let params = params.as_deref();
            let error = typed::<SessionRef>(params).err().map(|e| protocol::raw(&e));
            error.map(|e| e.get().to_owned())
        };
        assert_eq!(
            error(None).as_deref(),
            Some(
                r#"{"code":-32602,"message":"Invalid params","data":"invalid type: null, expected struct SessionRef at line 1 column 4"}"#
            )
        );
        assert_eq!(
            error(raw(r#"{"session":1}"#)).as_deref(),
            Some(
                r#"{"code":-32602,"message":"Invalid params","data":"missing field `sessionId` at line 1 column 13"}"#
            )
        );
        assert_eq!(error(raw(r#"{"sessionId":"s"}"#)), None);
    }
}
