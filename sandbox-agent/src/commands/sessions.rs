//! `sandbox-agent sessions list|show ID|events ID [--follow]`: the session
//! inventory, a page at a time, and the event logs for people who live in
//! a terminal (research/contract.md, "Durable sessions", "CLI:
//! sandbox-agent sessions").
//!
//! Two sources, one output:
//! - a running server (`--url`, the default `http://127.0.0.1:2468`):
//!   its control plane through the SDK (`list_session_entries`,
//!   `inventory_entry`, `inventory_events`): `GET /v2/sessions` (paged),
//!   `GET /v2/sessions/{id}` and `GET /v2/sessions/{id}/events`
//!   (research/contract.md, "Control plane");
//! - a session store (`--store sqlite:PATH` or `postgres://…`), read
//!   directly with the runtime's own store code, for a server that is not
//!   running. Its rows become the SDK's entries
//!   (`SessionEntry::from_meta`, the control plane's shape), so `--json`
//!   and the tables look the same either way.
//!
//! The tables go to stdout, one line per session or event; `--json` prints
//! the control plane's JSON instead (`events --follow --json`: one event
//! per line). A failure is a message for the user: the server's problem
//! `detail`, or why the store could not be read.

use super::args::{self, RemoteArgs, URL_ENV};
use acp_runtime::store::{self, Store, StoreUrl};
use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Subcommand, ValueEnum};
use ext_methods::meta::format_time;
use reqwest::Url;
use reqwest::header::HeaderValue;
use sandbox_agent_sdk::{
    Direction, EventPage, HttpFailure, SandboxAgentClient, SessionEntry, SessionEntryPage,
    SessionEntryQuery, SessionEvent, SessionEventsPage, SessionMeta, SessionState,
};
use serde_json::{Map, Value};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// The server asked when neither `--url` nor `SANDBOX_AGENT_URL` names one:
/// `sandbox-agent server`'s default address.
const DEFAULT_URL: &str = "http://127.0.0.1:2468";
/// Longest one control-plane request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Events asked for per page: the control plane's largest `limit`
/// (research/contract.md, "Control plane").
const PAGE_EVENTS: u32 = 1000;
/// Time between two polls of `events --follow`.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(500);
/// Longest summary on an event line, in characters (then `…`).
const SUMMARY_CHARS: usize = 100;
/// Longest title (or first prompt) on a `list` line, in characters (then
/// `…`), so a line stays readable in a terminal.
const TITLE_CHARS: usize = 60;
/// Sessions per `list` page from a store when `--limit` is not given: the
/// control plane's default (research/contract.md, "Control plane").
const DEFAULT_PAGE_SESSIONS: usize = 100;
/// Sessions per `list` page asked for by `--all` when `--limit` is not
/// given: the control plane's largest `limit` (research/contract.md,
/// "Control plane"), so a walk takes few requests.
const ALL_PAGE_SESSIONS: u32 = 1000;

/// `sandbox-agent sessions`.
#[derive(Debug, Clone, Args)]
// $SANDBOX_AGENT_URL is read in `Source::open`, not by clap: clap would
// count it as given and refuse it next to --store. The help is written as
// clap shows a one-paragraph doc comment: without the final period.
#[command(mut_arg("url", |url| url
    .help("The server to ask (http://host:port). Default: $SANDBOX_AGENT_URL, else http://127.0.0.1:2468")
    .conflicts_with("store")))]
pub struct SessionsArgs {
    /// What to show.
    #[command(subcommand)]
    pub command: SessionsCommand,
    /// `--url` and `--token`.
    #[command(flatten)]
    pub server: RemoteArgs,
    /// Read a session store instead of asking a server: `sqlite:PATH` (a
    /// server's default is sqlite:<data-dir>/sessions.db) or
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB` (TLS as libpq:
    /// `?sslmode=verify-full&sslrootcert=CA.pem`). Opening it brings its
    /// schema up to this binary's version.
    #[arg(long, global = true, value_name = "URL", value_parser = StoreUrl::parse)]
    pub store: Option<StoreUrl>,
    /// With --store: whose sessions to read. Default: the id in
    /// <data-dir>/runtime-id.
    #[arg(
        long,
        global = true,
        env = "SANDBOX_AGENT_RUNTIME_ID",
        value_name = "ID"
    )]
    pub runtime_id: Option<String>,
    /// With --store: the data dir that holds the runtime-id file. Default:
    /// $XDG_DATA_HOME/sandbox-agent or ~/.local/share/sandbox-agent, as for
    /// the server.
    #[arg(
        long,
        global = true,
        env = "SANDBOX_AGENT_DATA_DIR",
        value_name = "DIR"
    )]
    pub data_dir: Option<PathBuf>,
    /// Only sessions of this agent; picks one when agents share a session id.
    #[arg(long, global = true, value_name = "ID")]
    pub agent: Option<String>,
    /// Print the control plane's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

/// The `sessions` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum SessionsCommand {
    /// One page of sessions (100 unless --limit), newest first, a line
    /// each: id, agent, state (live/dormant/ended), events, last activity,
    /// and the title (or, quoted, the first prompt). When there are more,
    /// the next page's `--cursor C` is printed on stderr.
    List(ListArgs),
    /// Every field of one session.
    Show {
        /// The session id.
        #[arg(value_parser = NonEmptyStringValueParser::new())]
        id: String,
    },
    /// The session's recorded ACP messages, one line each: offset, time,
    /// direction, method (or result/error and the request id), a summary.
    Events {
        /// The session id.
        #[arg(value_parser = NonEmptyStringValueParser::new())]
        id: String,
        /// Keep polling for new events (every 500 ms) until Ctrl-C; needs a
        /// server.
        #[arg(long, short)]
        follow: bool,
        /// The first offset to show.
        #[arg(long, value_name = "N", default_value_t = 0)]
        from: u64,
    },
}

/// `sandbox-agent sessions list`: which page, and which sessions.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Sessions per page, 1 to 1000. Default: 100 (with --all, 1000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: Option<u32>,
    /// Start at the page this cursor names: the one a previous `list`
    /// printed, with the same --agent, --state and --query.
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
    /// Only sessions in this state.
    #[arg(long, value_enum, value_name = "STATE")]
    pub state: Option<StateFilter>,
    /// Only sessions whose title contains TEXT (ASCII letters in any case).
    #[arg(long, short = 'q', value_name = "TEXT")]
    pub query: Option<String>,
    /// Every page, from --cursor (or the first) to the last, in one table.
    #[arg(long)]
    pub all: bool,
}

/// The states `list --state` keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateFilter {
    /// Hosted by a running agent process.
    Live,
    /// Restored from the store and not loaded since.
    Dormant,
    /// Ended.
    Ended,
}

impl StateFilter {
    /// The SDK's state (the control plane's `state=`).
    fn state(self) -> SessionState {
        match self {
            StateFilter::Live => SessionState::Live,
            StateFilter::Dormant => SessionState::Dormant,
            StateFilter::Ended => SessionState::Ended,
        }
    }
}

/// Runs `sandbox-agent sessions …`.
///
/// # Errors
/// A message for the user: the server's problem `detail` (an unknown
/// session, a session id several agents share, a bad token), a server that
/// cannot be reached, a store that cannot be opened or read.
pub async fn run(args: SessionsArgs) -> Result<(), String> {
    if matches!(args.command, SessionsCommand::Events { follow: true, .. }) && args.store.is_some()
    {
        return Err("--follow needs a server (--url); a store is read once".to_owned());
    }
    let source = Source::open(&args).await?;
    let result = match &args.command {
        SessionsCommand::List(list_args) => list(&source, &args, list_args).await,
        SessionsCommand::Show { id } => {
            let entry = source.show(id, args.agent.as_deref()).await?;
            if args.json {
                print_json(&entry.value)
            } else {
                print_entry(&entry)
            }
        }
        SessionsCommand::Events { id, follow, from } => {
            events(&source, &args, id, *from, *follow).await
        }
    };
    if let Source::Store(store) = &source {
        store.close().await;
    }
    result
}

/// `list`: one page of the inventory (every page with `--all`), with the
/// filters given; the next page's cursor on stderr.
async fn list(source: &Source, args: &SessionsArgs, list_args: &ListArgs) -> Result<(), String> {
    let mut request = SessionEntryQuery {
        limit: list_args
            .limit
            .or(list_args.all.then_some(ALL_PAGE_SESSIONS)),
        cursor: list_args.cursor.clone(),
        agent: args.agent.clone(),
        state: list_args.state.map(StateFilter::state),
        // As the server: an empty text filters nothing.
        title_contains: list_args.query.clone().filter(|text| !text.is_empty()),
    };
    let mut page = source.list(&request).await?;
    if list_args.all {
        let mut sessions = Vec::new();
        loop {
            sessions.append(&mut page.sessions);
            let Some(next) = page.next_cursor.take() else {
                break;
            };
            if request.cursor.as_deref() == Some(next.as_str()) {
                return Err(format!(
                    "the server answered the cursor {next:?} with itself"
                ));
            }
            request.cursor = Some(next);
            page = source.list(&request).await?;
        }
        page = SessionEntryPage {
            sessions,
            next_cursor: None,
        };
    }
    if args.json {
        return print_json(&page_json(&page, matches!(source, Source::Store(_))));
    }
    if page.sessions.is_empty() {
        eprintln!("no sessions");
    } else {
        print_list(&page.sessions)?;
    }
    if let Some(next) = &page.next_cursor {
        eprintln!("next page: --cursor {}", shell_word(next));
    }
    Ok(())
}

/// A page as `--json` prints it: `{"sessions": [entry, …], "nextCursor"?}`
/// in the server's order; `cursor_first` puts `nextCursor` first, as this
/// command has always printed a store's page.
fn page_json(page: &SessionEntryPage, cursor_first: bool) -> Value {
    let sessions = page
        .sessions
        .iter()
        .map(|entry| serde_json::to_value(&entry.value).unwrap_or(Value::Null))
        .collect();
    let cursor = page.next_cursor.clone().map(Value::String);
    let mut body = Map::new();
    if cursor_first && let Some(cursor) = cursor.clone() {
        body.insert("nextCursor".to_owned(), cursor);
    }
    body.insert("sessions".to_owned(), Value::Array(sessions));
    if !cursor_first && let Some(cursor) = cursor {
        body.insert("nextCursor".to_owned(), cursor);
    }
    Value::Object(body)
}

/// `text` as one word for a POSIX shell: as is when it holds only
/// characters no shell treats specially, else in single quotes.
fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@%+=,".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// The `list` table: a header, then a line per entry, in aligned columns.
fn print_list(entries: &[SessionEntry]) -> Result<(), String> {
    let rows: Vec<[String; 6]> = entries.iter().map(list_row).collect();
    let header = ["ID", "AGENT", "STATE", "EVENTS", "UPDATED (UTC)", "TITLE"].map(str::to_owned);
    let mut widths = [0; 6];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let [id, agent, state, count, updated, title] = row;
        let line = format!(
            "{id:<w0$}  {agent:<w1$}  {state:<w2$}  {count:>w3$}  {updated:<w4$}  {title}",
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
            w4 = widths[4],
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    emit(&out)
}

/// The cells of one `list` line.
fn list_row(entry: &SessionEntry) -> [String; 6] {
    let id = entry.session_id.to_string();
    let Some(meta) = &entry.meta else {
        return [
            id,
            "?".into(),
            "?".into(),
            "?".into(),
            "?".into(),
            "".into(),
        ];
    };
    [
        id,
        meta.agent.clone(),
        state(meta).to_owned(),
        meta.event_count.to_string(),
        date_time(&meta.updated_at),
        title_cell(meta),
    ]
}

/// What `list` shows as a session's title: its title, else its first
/// prompt's text in double quotes (as `events` shows a prompt), else
/// nothing; one line, at most [`TITLE_CHARS`] characters.
fn title_cell(meta: &SessionMeta) -> String {
    fn text(text: Option<&str>) -> Option<&str> {
        text.filter(|text| !text.is_empty())
    }
    match (
        text(meta.title.as_deref()),
        text(meta.first_prompt.as_deref()),
    ) {
        (Some(title), _) => cut(title, TITLE_CHARS),
        (None, Some(prompt)) => format!("\"{}\"", cut(prompt, TITLE_CHARS - 2)),
        (None, None) => String::new(),
    }
}

/// `show`: one field per line.
fn print_entry(entry: &SessionEntry) -> Result<(), String> {
    let info = &entry.value;
    let meta = &entry.meta;
    let text = |value: Option<&str>| value.map_or_else(|| "-".to_owned(), one_line);
    let mut fields = vec![
        ("id", info.session_id.0.to_string()),
        ("agent", text(meta.as_ref().map(|m| m.agent.as_str()))),
        ("state", text(meta.as_ref().map(state))),
        ("cwd", info.cwd.display().to_string()),
        (
            "title",
            text(meta.as_ref().and_then(|m| m.title.as_deref())),
        ),
        (
            "model",
            text(meta.as_ref().and_then(|m| m.model.as_deref())),
        ),
        ("mode", text(meta.as_ref().and_then(|m| m.mode.as_deref()))),
    ];
    if let Some(meta) = meta {
        fields.push(("created", format!("{} UTC", date_time(&meta.created_at))));
        fields.push(("updated", format!("{} UTC", date_time(&meta.updated_at))));
        fields.push(("events", meta.event_count.to_string()));
        if !meta.extra.is_empty() {
            fields.push(("metadata", Value::Object(meta.extra.clone()).to_string()));
        }
    }
    let mut out = String::new();
    for (name, value) in fields {
        out.push_str(&format!("{name:<9} {value}\n"));
    }
    emit(&out)
}

/// `events`: every page from `from` on; with `follow`, then a poll every
/// [`FOLLOW_INTERVAL`] until Ctrl-C.
async fn events(
    source: &Source,
    args: &SessionsArgs,
    id: &str,
    from: u64,
    follow: bool,
) -> Result<(), String> {
    // Resolve the session once (an unknown id fails here), then page with
    // its agent, so a session of another agent with the same id that
    // appears later cannot switch the log under us.
    let entry = source.show(id, args.agent.as_deref()).await?;
    let agent = entry
        .meta
        .map(|meta| meta.agent)
        .or_else(|| args.agent.clone());
    let agent = agent.as_deref();
    let mut offset = from;
    let mut collected = Vec::new();
    loop {
        let page = source.events(id, agent, offset).await?;
        let done = page.next_offset.is_none();
        offset = page.offset_after.max(offset);
        if args.json && !follow {
            collected.extend(page.events);
        } else {
            print_events(&page.events, args.json)?;
        }
        if done {
            break;
        }
    }
    if !follow {
        if args.json {
            return print_json(&SessionEventsPage {
                events: collected,
                next_offset: offset,
            });
        }
        return Ok(());
    }
    let poll = async {
        loop {
            tokio::time::sleep(FOLLOW_INTERVAL).await;
            loop {
                let page = source.events(id, agent, offset).await?;
                let done = page.next_offset.is_none();
                offset = page.offset_after.max(offset);
                print_events(&page.events, args.json)?;
                if done {
                    break;
                }
            }
        }
    };
    tokio::select! {
        result = poll => result,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

/// Prints `events`: a line each, or (`json`) one compact JSON object each.
fn print_events(events: &[SessionEvent], json: bool) -> Result<(), String> {
    let mut out = String::new();
    for event in events {
        if json {
            out.push_str(&serde_json::to_string(event).map_err(|e| e.to_string())?);
        } else {
            out.push_str(event_line(event).trim_end());
        }
        out.push('\n');
    }
    emit(&out)
}

/// One event as a line: `offset  time  arrow  label  summary`.
fn event_line(event: &SessionEvent) -> String {
    let arrow = match event.direction {
        Direction::ClientToAgent => '→',
        Direction::AgentToClient => '←',
    };
    let (label, summary) = describe(&event.message);
    format!(
        "{:>6}  {}  {arrow}  {label:<26}  {}",
        event.offset,
        clock(&event.at),
        truncate(&summary)
    )
}

/// What a JSON-RPC message is (`session/prompt #2`, `session/update`,
/// `result #2`, `error #2`) and a short summary of it.
fn describe(message: &Value) -> (String, String) {
    let id = message.get("id").map(|id| format!(" #{}", short_id(id)));
    if let Some(method) = message.get("method").and_then(Value::as_str) {
        let label = format!("{method}{}", id.unwrap_or_default());
        let params = message.get("params").unwrap_or(&Value::Null);
        return (label, params_summary(method, params));
    }
    let id = id.unwrap_or_default();
    if let Some(error) = message.get("error") {
        let code = error.get("code").map(Value::to_string).unwrap_or_default();
        let text = error.get("message").and_then(Value::as_str).unwrap_or("");
        return (format!("error{id}"), format!("{code} {text}"));
    }
    if let Some(result) = message.get("result") {
        return (format!("result{id}"), result_summary(result));
    }
    ("?".to_owned(), compact(message))
}

/// A JSON-RPC id as shown: a number as is, a long string (a UUID) cut to
/// its first 8 characters, enough to match a request with its answer.
fn short_id(id: &Value) -> String {
    match id {
        Value::String(text) if text.chars().count() > 12 => {
            let mut short: String = text.chars().take(8).collect();
            short.push('…');
            short
        }
        Value::String(text) => one_line(text),
        _ => id.to_string(),
    }
}

/// The part of a request's or notification's params worth a glance.
fn params_summary(method: &str, params: &Value) -> String {
    match method {
        "session/update" => {
            let update = &params["update"];
            let kind = update["sessionUpdate"].as_str().unwrap_or("?");
            let detail = update["content"]["text"]
                .as_str()
                .map(|text| format!("{text:?}"))
                .or_else(|| update["title"].as_str().map(|title| format!("{title:?}")))
                .or_else(|| update["status"].as_str().map(str::to_owned));
            match detail {
                Some(detail) => format!("{kind} {detail}"),
                None => kind.to_owned(),
            }
        }
        "session/prompt" => {
            let texts: Vec<&str> = params["prompt"]
                .as_array()
                .map(|blocks| {
                    blocks
                        .iter()
                        .filter_map(|block| block["text"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            format!("{:?}", texts.join(" "))
        }
        "session/new" | "session/load" | "session/resume" => params["cwd"]
            .as_str()
            .map_or_else(|| compact(params), |cwd| format!("cwd {cwd}")),
        "session/request_permission" => params["toolCall"]["title"]
            .as_str()
            .map_or_else(|| compact(params), |title| format!("{title:?}")),
        _ => compact(params),
    }
}

/// The part of a result worth a glance: a stop reason, a new session id.
fn result_summary(result: &Value) -> String {
    if let Some(reason) = result["stopReason"].as_str() {
        return reason.to_owned();
    }
    if let Some(session) = result["sessionId"].as_str() {
        return format!("sessionId {session}");
    }
    compact(result)
}

/// `value` as one line of JSON; nothing for `null` and `{}`.
fn compact(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::Object(map) if map.is_empty() => String::new(),
        _ => value.to_string(),
    }
}

/// At most [`SUMMARY_CHARS`] characters of `text`, on one line.
fn truncate(text: &str) -> String {
    cut(text, SUMMARY_CHARS)
}

/// `text` on one line and at most `chars` characters, its end replaced by
/// `…` when it is longer.
fn cut(text: &str, chars: usize) -> String {
    let text = one_line(text);
    if text.chars().count() <= chars {
        return text;
    }
    let mut short: String = text.chars().take(chars.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// `text` with line breaks and other control characters as spaces, so a
/// title or a chunk cannot break a table's lines.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `live`, `dormant` (restored from the store, agent not started) or
/// `ended`.
fn state(meta: &SessionMeta) -> &'static str {
    SessionState::of(meta).as_str()
}

/// An RFC 3339 time as `2026-12-01 04:05:24.123` (UTC); as given when it
/// does not parse.
fn date_time(at: &str) -> String {
    let Some(time) = ext_methods::meta::parse_time(at) else {
        return at.to_owned();
    };
    let text = format_time(time);
    text.trim_end_matches('Z').replacen('T', " ", 1)
}

/// An RFC 3339 time as its time of day, `04:05:24.123` (UTC).
fn clock(at: &str) -> String {
    let full = date_time(at);
    match full.split_once(' ') {
        Some((_, time)) => time.to_owned(),
        None => full,
    }
}

/// Writes `text` to stdout.
fn emit(text: &str) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))
}

fn print_json(value: &impl serde::Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    emit(&format!("{text}\n"))
}

/// Where the sessions are read from.
enum Source {
    /// A running server's control plane.
    Server(Server),
    /// A session store, read directly.
    Store(Store),
}

impl Source {
    /// The source `args` name: `--store`, else the server at `--url`.
    async fn open(args: &SessionsArgs) -> Result<Source, String> {
        let Some(url) = &args.store else {
            let base = args
                .server
                .url
                .clone()
                .or_else(|| std::env::var(URL_ENV).ok().filter(|url| !url.is_empty()))
                .unwrap_or_else(|| DEFAULT_URL.to_owned());
            return Server::new(&base, args.server.token.as_deref())
                .await
                .map(Source::Server);
        };
        if let StoreUrl::Sqlite(path) = url
            && !path.is_file()
        {
            // Opening would create an empty one.
            return Err(format!("no session store at {}", path.display()));
        }
        let runtime_id = match &args.runtime_id {
            Some(id) => id.clone(),
            None => {
                let data_dir = args
                    .data_dir
                    .clone()
                    .or_else(acp_runtime::config::default_data_dir)
                    .ok_or(
                        "no data dir: set --runtime-id or --data-dir (or SANDBOX_AGENT_DATA_DIR)",
                    )?;
                let file = data_dir.join(store::RUNTIME_ID_FILE);
                if !file.is_file() {
                    // Reading it would make a new id, with no sessions.
                    return Err(format!(
                        "no runtime id at {}: pass --runtime-id, or --data-dir of the server that wrote the store",
                        file.display()
                    ));
                }
                store::default_runtime_id(&data_dir).map_err(|e| e.to_string())?
            }
        };
        match Store::open(url, &runtime_id).await {
            Ok(Some(store)) => Ok(Source::Store(store)),
            Ok(None) => Err("--store memory keeps nothing to read".to_owned()),
            Err(error) => Err(error.to_string()),
        }
    }

    /// One page of entries, newest first, and the next page's cursor.
    async fn list(&self, request: &SessionEntryQuery) -> Result<SessionEntryPage, String> {
        match self {
            Source::Server(server) => server
                .client
                .list_session_entries(request.clone())
                .await
                .map_err(|error| server.message(&error)),
            Source::Store(store) => stored_page(store, request).await,
        }
    }

    /// One inventory entry: session `id` of `agent`, or the one session
    /// with that id.
    async fn show(&self, id: &str, agent: Option<&str>) -> Result<SessionEntry, String> {
        match self {
            Source::Server(server) => server
                .client
                .inventory_entry(id.to_owned(), agent)
                .await
                .map_err(|error| server.message(&error)),
            Source::Store(store) => {
                // Through the store's index on ids, not a read of every row.
                let rows = store
                    .entries_of(agent, id)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut found: Vec<_> = rows.iter().collect();
                match found.len() {
                    0 => Err(format!("no session with id {id:?} in {}", store.describe())),
                    1 => Ok(stored_entry(found.remove(0))),
                    _ => {
                        let agents: Vec<&str> = found.iter().map(|row| &*row.agent).collect();
                        Err(format!(
                            "session id {id:?} is used by the agents {}; pick one with --agent",
                            agents.join(", ")
                        ))
                    }
                }
            }
        }
    }

    /// Up to [`PAGE_EVENTS`] events of the session from `offset` on;
    /// `next_offset` is set when the page is full (there may be more).
    async fn events(
        &self,
        id: &str,
        agent: Option<&str>,
        offset: u64,
    ) -> Result<EventPage, String> {
        match self {
            Source::Server(server) => server
                .client
                .inventory_events(id.to_owned(), agent, offset, Some(PAGE_EVENTS))
                .await
                .map_err(|error| server.message(&error)),
            Source::Store(store) => {
                let agent = agent.ok_or("the session's agent is not known")?;
                let rows = store
                    .events(
                        agent,
                        id,
                        offset,
                        PAGE_EVENTS as usize,
                        acp_runtime::config::DEFAULT_EVENT_LOG_BYTES,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                let events: Vec<SessionEvent> = rows.into_iter().map(stored_event).collect();
                let after = events.last().map_or(offset, |event| event.offset + 1);
                Ok(EventPage {
                    next_offset: (events.len() == PAGE_EVENTS as usize).then_some(after),
                    offset_after: after,
                    events,
                })
            }
        }
    }
}

/// A page of stored entries as `GET /v2/sessions` gives it, with the same
/// filters and a cursor of the same form (`{nanos}:{agent}:{id}`, the
/// place of the page's last entry in the order), read through the store's
/// `sessions_newest_first` index, so a page reads the same from the store
/// as from its server at any store size. Every stored session that has
/// not ended is dormant here, so `--state live` lists none.
async fn stored_page(
    store: &Store,
    request: &SessionEntryQuery,
) -> Result<SessionEntryPage, String> {
    let after = request
        .cursor
        .as_deref()
        .map(|cursor| {
            store::parse_cursor(cursor).ok_or_else(|| {
                format!("invalid cursor {cursor:?}: pass the one an earlier `list` printed")
            })
        })
        .transpose()?;
    let mut page = SessionEntryPage {
        sessions: Vec::new(),
        next_cursor: None,
    };
    if request.state == Some(SessionState::Live) {
        return Ok(page);
    }
    let limit = request
        .limit
        .map_or(DEFAULT_PAGE_SESSIONS, |limit| limit as usize);
    let query = store::PageQuery {
        // One more tells whether there is a next page.
        limit: limit + 1,
        after,
        agent: request.agent.clone(),
        cwd: None,
        ended: request.state.map(|state| state == SessionState::Ended),
        title: request.title_contains.clone(),
    };
    let mut rows = store.page(&query).await.map_err(|e| e.to_string())?;
    if rows.len() > limit {
        rows.truncate(limit);
        page.next_cursor = rows
            .last()
            .map(|last| store::cursor(last.created_ns, &last.agent, &last.session_id));
    }
    page.sessions = rows.iter().map(stored_entry).collect();
    Ok(page)
}

/// A stored session as the server lists it. A session the store has not
/// seen end is dormant: no agent holds it while only the store is read
/// (research/contract.md, "Durable sessions").
fn stored_entry(row: &store::SessionRow) -> SessionEntry {
    let meta = SessionMeta {
        agent: row.agent.to_string(),
        created_at: format_time(store::time_of(row.created_ns)),
        updated_at: format_time(store::time_of(row.updated_ns)),
        ended: row.end_reason.is_some(),
        dormant: row.end_reason.is_none(),
        event_count: row.event_count,
        title: row.title.clone(),
        model: row.model.clone(),
        mode: row.mode.clone(),
        first_prompt: row.first_prompt.clone(),
        extra: SessionMeta::extra_from(&row.metadata),
    };
    SessionEntry::from_meta(
        row.session_id.to_string(),
        row.cwd.clone().unwrap_or_default(),
        meta,
    )
}

/// A stored event in the shape `GET /v2/sessions/{id}/events` gives it.
fn stored_event(row: store::EventRow) -> SessionEvent {
    SessionEvent {
        offset: row.offset,
        at: format_time(store::time_of(row.at_ns)),
        direction: row.direction,
        message: serde_json::from_slice(&row.message)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&row.message).into_owned())),
    }
}

/// A server's control plane, through the SDK.
struct Server {
    client: SandboxAgentClient,
    /// `--url` as parsed: the failures name it.
    base: Url,
}

impl Server {
    /// The control plane of the server at `base`, each request bounded by
    /// [`REQUEST_TIMEOUT`].
    async fn new(base: &str, token: Option<&str>) -> Result<Server, String> {
        let url = Url::parse(base).map_err(|e| format!("--url {base:?}: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
            return Err(format!(
                "--url {base:?}: must be an http or https URL, as in {DEFAULT_URL}"
            ));
        }
        if let Some(token) = token
            && HeaderValue::from_str(&format!("Bearer {token}")).is_err()
        {
            return Err("--token is not a valid header value".to_owned());
        }
        Ok(Server {
            client: args::client(base, token, Some(REQUEST_TIMEOUT)).await?,
            base: url,
        })
    }

    /// What the user reads for a failed request: the problem's `detail`
    /// ([`problem_message`]); for a server that cannot be reached (or
    /// answers too slowly) `cannot reach URL: <innermost cause>`; for an
    /// answer cut off `GET PATH: <cause>`; for one of the wrong shape `GET
    /// PATH: the answer is not JSON: …`.
    fn message(&self, error: &sandbox_agent_sdk::Error) -> String {
        if let sandbox_agent_sdk::Error::Http(failure) = error {
            return problem_message(failure);
        }
        if let sandbox_agent_sdk::Error::InvalidResponse { what, message } = error {
            return format!("{what}: the answer is not JSON: {message}");
        }
        match args::reqwest_error(error) {
            Some(cause) if cause.is_body() || cause.is_decode() => {
                let path = cause.url().map_or("", Url::path);
                format!("GET {path}: {}", root_cause(cause))
            }
            Some(cause) => format!("cannot reach {}: {}", self.base, root_cause(cause)),
            None => error.to_string(),
        }
    }
}

/// What the user reads for a failed request: the problem's `detail`, with
/// a hint where the CLI spells the fix differently from the HTTP API.
fn problem_message(failure: &HttpFailure) -> String {
    let Some(problem) = &failure.problem else {
        return failure.to_string();
    };
    let Some(detail) = problem.detail.as_deref().or(problem.title.as_deref()) else {
        return failure.to_string();
    };
    if problem.problem_type.ends_with("ambiguous-session") {
        return format!("{detail} (--agent picks one)");
    }
    detail.to_owned()
}

/// The innermost source of `error` ("Connection refused (os error 111)"):
/// reqwest's own message only says "error sending request for url …".
fn root_cause(error: &dyn std::error::Error) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(direction: Direction, message: Value) -> SessionEvent {
        SessionEvent {
            offset: 7,
            at: "2026-12-01T04:05:24.123Z".to_owned(),
            direction,
            message,
        }
    }

    #[test]
    fn a_chunk_shows_its_kind_and_text() {
        let line = event_line(&event(
            Direction::AgentToClient,
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s",
                "update": {"sessionUpdate": "agent_message_chunk",
                           "content": {"type": "text", "text": "Hello\n"}}}}),
        ));
        assert_eq!(
            line,
            format!(
                "     7  04:05:24.123  ←  {:<26}  agent_message_chunk \"Hello\\n\"",
                "session/update"
            )
        );
    }

    #[test]
    fn requests_and_answers_carry_their_id() {
        let prompt = json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
            "params": {"sessionId": "s", "prompt": [{"type": "text", "text": "hi there"}]}});
        assert_eq!(
            describe(&prompt),
            ("session/prompt #2".to_owned(), "\"hi there\"".to_owned())
        );
        let result = json!({"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}});
        assert_eq!(
            describe(&result),
            ("result #2".to_owned(), "end_turn".to_owned())
        );
        let error =
            json!({"jsonrpc": "2.0", "id": "a", "error": {"code": -32000, "message": "no"}});
        assert_eq!(
            describe(&error),
            ("error #a".to_owned(), "-32000 no".to_owned())
        );
    }

    #[test]
    fn long_string_ids_are_cut() {
        let id = json!("4038730b-086d-410c-8cf9-ac66f72399e6");
        assert_eq!(short_id(&id), "4038730b…");
        assert_eq!(short_id(&json!(12)), "12");
    }

    #[test]
    fn long_summaries_are_cut() {
        let long = "x".repeat(300);
        let cut = truncate(&long);
        assert_eq!(cut.chars().count(), SUMMARY_CHARS);
        assert!(cut.ends_with('…'));
        assert_eq!(truncate("a\nb"), "a b");
    }

    #[test]
    fn a_list_shows_the_title_else_the_first_prompt_cut_to_fit() {
        let entry = |mut namespace: Value| {
            namespace["agent"] = json!("mock");
            namespace["createdAt"] = json!("2026-12-01T04:05:24.123Z");
            namespace["updatedAt"] = json!("2026-12-01T04:05:24.123Z");
            namespace["ended"] = json!(false);
            namespace["eventCount"] = json!(0);
            match serde_json::from_value::<SessionMeta>(namespace) {
                Ok(meta) => meta,
                Err(error) => panic!("a namespace object: {error}"),
            }
        };
        assert_eq!(
            title_cell(&entry(json!({"title": "Fix it", "firstPrompt": "please"}))),
            "Fix it"
        );
        assert_eq!(
            title_cell(&entry(json!({"firstPrompt": "please\nfix it"}))),
            "\"please fix it\""
        );
        assert_eq!(title_cell(&entry(json!({"title": ""}))), "");
        assert_eq!(title_cell(&entry(json!({}))), "");
        let long = title_cell(&entry(json!({"firstPrompt": "y".repeat(300)})));
        assert_eq!(long.chars().count(), TITLE_CHARS);
        assert!(long.ends_with("…\""), "{long}");
    }

    #[test]
    fn cursors_are_printed_as_one_shell_word() {
        assert_eq!(
            shell_word("1764000000:mock:mock-1a2b"),
            "1764000000:mock:mock-1a2b"
        );
        assert_eq!(shell_word("1:mock:team a/run 1"), "'1:mock:team a/run 1'");
        assert_eq!(shell_word("1:mock:it's"), "'1:mock:it'\\''s'");
    }

    #[test]
    fn a_cursor_names_a_place_in_the_order() {
        assert_eq!(
            store::parse_cursor("17:mock:a:b"),
            Some((17, "mock".to_owned(), "a:b".to_owned()))
        );
        assert_eq!(store::parse_cursor("x:mock:a"), None);
        assert_eq!(store::parse_cursor("17-mock"), None);
    }

    #[test]
    fn times_are_shown_in_utc() {
        assert_eq!(
            date_time("2026-12-01T04:05:24.123Z"),
            "2026-12-01 04:05:24.123"
        );
        assert_eq!(clock("2026-12-01T04:05:24.123Z"), "04:05:24.123");
        assert_eq!(clock("yesterday"), "yesterday");
    }
}
