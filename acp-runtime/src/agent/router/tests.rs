//! The routing table driven by scripted agent lines: a [`Router`] over a real
//! session inventory and connection registry, with the agent's stdin as a
//! channel the tests read. Each test states one routing rule of
//! research/contract.md ("Routing: connections, sessions, one agent
//! process") and fails if it breaks.

use super::*;
use crate::memory::connection::{Batch, ClientCapabilities, Profile, ReplayLimits};
use crate::memory::event_log::LogLimits;
use crate::memory::sessions::InventoryLimits;
use ext_methods::notification::SESSION_ENDED;
use serde_json::json;
use tokio::sync::oneshot::error::TryRecvError;

/// The agent id every fixture connection is bound to.
const AGENT: &str = "mock";
/// The process generation of the fixture's router.
const GENERATION: u64 = 3;

/// One router with its surroundings.
struct Fixture {
    router: Router,
    /// What the router wrote to the agent's stdin.
    stdin: mpsc::Receiver<Bytes>,
    targets: RouteTargets,
}

impl Fixture {
    fn new() -> Self {
        Self::with_client_side(None)
    }

    /// A router whose runtime serves the agent's file requests, refusing
    /// `data_dir` (research/contract.md, "Files and terminals of the agent,
    /// served in the sandbox").
    fn serving_files(data_dir: &std::path::Path) -> Self {
        Self::with_client_side(Some(Arc::new(ClientSide::new(
            None,
            None,
            data_dir,
            None,
            1 << 20,
        ))))
    }

    fn with_client_side(client_side: Option<Arc<ClientSide>>) -> Self {
        let served = client_side
            .as_ref()
            .map(|client_side| client_side.declare(&json!({})).1)
            .unwrap_or_default();
        let (stdin, receiver) = mpsc::channel(1024);
        let targets = RouteTargets {
            sessions: Arc::new(Sessions::new(
                InventoryLimits {
                    log: LogLimits {
                        events: 10_000,
                        bytes: usize::MAX,
                    },
                    ended_sessions: 16,
                },
                None,
            )),
            connections: Arc::new(Connections::new(
                16,
                ReplayLimits {
                    events: 10_000,
                    bytes: usize::MAX,
                },
            )),
            client_side,
            metrics: Default::default(),
        };
        let mut router = Router::new(
            AGENT.into(),
            GENERATION,
            stdin,
            targets.clone(),
            Arc::new(Mutex::new(ReportedHints::default())),
            CancellationToken::new(),
        );
        router.set_served(served);
        Self {
            router,
            stdin: receiver,
            targets,
        }
    }

    /// A connection of [`AGENT`] whose `initialize` declared `caps` as
    /// `clientCapabilities`.
    fn open(&self, caps: Value) -> Arc<Connection> {
        self.open_for(AGENT, caps)
    }

    /// A connection of `agent`.
    fn open_for(&self, agent: &str, caps: Value) -> Arc<Connection> {
        self.open_with(
            agent,
            json!({ "protocolVersion": 1, "clientCapabilities": caps }),
        )
    }

    /// A connection of [`AGENT`] that declared `caps` and takes the file and
    /// terminal requests itself (`fsAndTerminal: "client"`).
    fn open_serving(&self, caps: Value) -> Arc<Connection> {
        let meta = json!({ "sandboxagent.dev": { "agent": AGENT, "fsAndTerminal": "client" } });
        self.open_with(
            AGENT,
            json!({ "protocolVersion": 1, "clientCapabilities": caps, "_meta": meta }),
        )
    }

    /// A connection of `agent` opened with these `initialize` params.
    fn open_with(&self, agent: &str, params: Value) -> Arc<Connection> {
        let params = raw(params);
        let caps = ClientCapabilities::from_initialize_params(Some(&params));
        self.targets
            .connections
            .open(agent.into(), caps, Profile::V2Rpc)
            .expect("below the connection cap")
    }

    /// One line on the agent's stdout.
    fn agent_line(&self, line: &str) {
        let _ = self.router.dispatch(Bytes::from(line.to_owned()));
    }

    /// The lines written to the agent's stdin since the last call, each
    /// checked to end with exactly one newline, returned without it.
    fn stdin_lines(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        while let Ok(bytes) = self.stdin.try_recv() {
            let text = String::from_utf8(bytes.to_vec()).expect("stdin lines are UTF-8");
            let line = text.strip_suffix('\n').expect("stdin line ends with \\n");
            assert!(!line.contains('\n'), "one line per message: {text:?}");
            lines.push(line.to_owned());
        }
        lines
    }

    /// The next line written to stdin, waiting for it (the runtime answers
    /// file requests in a task of its own), parsed.
    async fn stdin_soon(&mut self) -> Value {
        let bytes = tokio::time::timeout(Duration::from_secs(10), self.stdin.recv())
            .await
            .expect("an answer within 10 s")
            .expect("stdin open");
        serde_json::from_slice(&bytes).expect("stdin line is JSON")
    }

    /// The one line written to stdin since the last read, parsed.
    fn stdin_one(&mut self) -> Value {
        let lines = self.stdin_lines();
        assert_eq!(lines.len(), 1, "expected one stdin line: {lines:?}");
        serde_json::from_str(&lines[0]).expect("stdin line is JSON")
    }

    /// A client's request through [`Router::send_request`], `client_id` as raw
    /// JSON (`1`, `"1"`).
    async fn send(
        &self,
        connection: &Arc<Connection>,
        client_id: &str,
        method: &str,
        params: Value,
        effect: Effect,
        session: Option<&str>,
    ) -> oneshot::Receiver<Bytes> {
        let id = RawValue::from_string(client_id.to_owned()).expect("raw id");
        let params = raw(params);
        self.router
            .send_request(
                connection,
                &id,
                Method::parse(method),
                method,
                Some(&params),
                effect,
                session.map(Into::into),
                &tracing::Span::none(),
            )
            .await
            .expect("the process is running")
    }

    /// Sends a request and returns its receiver and the id the agent got.
    async fn send_and_read_id(
        &mut self,
        connection: &Arc<Connection>,
        client_id: &str,
        method: &str,
        params: Value,
        effect: Effect,
        session: Option<&str>,
    ) -> (oneshot::Receiver<Bytes>, i64) {
        let receiver = self
            .send(connection, client_id, method, params, effect, session)
            .await;
        let sent = self.stdin_one();
        assert_eq!(sent["method"], method);
        let agent_id = sent["id"].as_i64().expect("integer id toward the agent");
        (receiver, agent_id)
    }

    /// `connection` sends `session/new` (as the runtime does: with
    /// [`Effect::CreateSession`]); returns the receiver and the agent-side id,
    /// unanswered.
    async fn start_session_new(
        &mut self,
        connection: &Arc<Connection>,
        client_id: &str,
    ) -> (oneshot::Receiver<Bytes>, i64) {
        let params = session_new_params();
        let effect = create_effect(client_id, &params);
        self.send_and_read_id(connection, client_id, "session/new", params, effect, None)
            .await
    }

    /// A session `session` created by `connection` (answered and checked).
    async fn create_session(
        &mut self,
        connection: &Arc<Connection>,
        client_id: &str,
        session: &str,
    ) -> Arc<Session> {
        let (mut receiver, agent_id) = self.start_session_new(connection, client_id).await;
        self.agent_line(&format!(
            r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"sessionId":"{session}"}}}}"#
        ));
        let reply = answer(&mut receiver);
        assert_eq!(reply["result"]["sessionId"], session);
        self.targets
            .sessions
            .live(session, GENERATION)
            .expect("the answer registered the session")
    }
}

/// `value` as raw JSON.
fn raw(value: Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(&value).expect("serializable")
}

/// Params of a client's `session/new`.
fn session_new_params() -> Value {
    json!({
        "cwd": "/work",
        "mcpServers": [],
        "_meta": { "sandboxagent.dev": { "agent": AGENT, "title": "T" } },
    })
}

/// What the runtime's `effect_of` builds for a `session/new` (the client's
/// POST body is the event log's first entry).
fn create_effect(client_id: &str, params: &Value) -> Effect {
    let request =
        format!(r#"{{"jsonrpc":"2.0","id":{client_id},"method":"session/new","params":{params}}}"#);
    Effect::CreateSession {
        cwd: Some("/work".to_owned()),
        metadata: params["_meta"]["sandboxagent.dev"]
            .as_object()
            .cloned()
            .unwrap_or_default(),
        request: Bytes::from(request),
    }
}

/// The JSON objects in `connection`'s ring, oldest first (a fresh stream
/// replays the whole ring).
fn events(connection: &Arc<Connection>) -> Vec<Value> {
    let mut stream = connection.open_stream(None).expect("open stream");
    let mut batch = Vec::new();
    while stream.next_batch(&mut batch) == Batch::Data {}
    batch
        .iter()
        .map(|message| serde_json::from_slice(&message.json).expect("events are JSON"))
        .collect()
}

/// The answer waiting on `receiver`, as raw text.
fn answer_text(receiver: &mut oneshot::Receiver<Bytes>) -> String {
    let bytes = receiver.try_recv().expect("an answer is waiting");
    String::from_utf8(bytes.to_vec()).expect("answer is UTF-8")
}

/// The answer waiting on `receiver`, parsed.
fn answer(receiver: &mut oneshot::Receiver<Bytes>) -> Value {
    serde_json::from_str(&answer_text(receiver)).expect("answer is JSON")
}

/// Asserts nothing was answered on `receiver` yet.
fn assert_unanswered(receiver: &mut oneshot::Receiver<Bytes>) {
    assert!(
        matches!(receiver.try_recv(), Err(TryRecvError::Empty)),
        "expected no answer yet"
    );
}

/// A `session/update` notification for `session` carrying `n`.
fn update(session: &str, n: usize) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{session}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{n}"}}}}}}}}"#
    )
}

/// The `n` carried by an [`update`].
fn update_n(event: &Value) -> usize {
    assert_eq!(event["method"], "session/update", "{event}");
    event["params"]["update"]["content"]["text"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .expect("an update made by `update`")
}

/// The JSON messages of `session`'s event log with their directions.
fn log(session: &Session) -> Vec<(Direction, Value)> {
    session
        .events(0, 100_000)
        .events
        .into_iter()
        .map(|event| (event.direction, event.message))
        .collect()
}

/// The `-32601` the router writes on a client's behalf.
fn method_not_found(id: Value, method: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": -32601,
            "message": format!("method not found: {method} (no attached client declared this capability)"),
        },
    })
}

fn value(text: &str) -> Value {
    serde_json::from_str(text).expect("test JSON")
}

// 1. Id rewriting and restoring.
#[tokio::test]
async fn client_ids_are_rewritten_toward_the_agent_and_restored_verbatim() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let b = f.open(json!({}));
    a.claim_request_id("1").expect("a free id").hand_over();
    b.claim_request_id(r#""1""#).expect("a free id").hand_over();
    b.claim_request_id("1").expect("a free id").hand_over();
    let mut from_a = f
        .send(
            &a,
            "1",
            "authenticate",
            json!({"methodId": "a"}),
            Effect::None,
            None,
        )
        .await;
    let mut from_b_text = f
        .send(
            &b,
            r#""1""#,
            "authenticate",
            json!({"methodId": "b"}),
            Effect::None,
            None,
        )
        .await;
    let mut from_b_number = f
        .send(
            &b,
            "1",
            "authenticate",
            json!({"methodId": "c"}),
            Effect::None,
            None,
        )
        .await;
    assert_eq!(
        f.stdin_lines(),
        [
            r#"{"jsonrpc":"2.0","id":1,"method":"authenticate","params":{"methodId":"a"}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"authenticate","params":{"methodId":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"authenticate","params":{"methodId":"c"}}"#,
        ],
        "three distinct agent ids, params verbatim"
    );

    // Answered out of order; each goes back with its client's raw id.
    f.agent_line(r#"{"jsonrpc":"2.0","id":2,"result":{"who": "b-text"}}"#);
    assert_eq!(
        answer_text(&mut from_b_text),
        r#"{"jsonrpc":"2.0","id":"1","result":{"who": "b-text"}}"#
    );
    assert_unanswered(&mut from_a);
    assert_unanswered(&mut from_b_number);
    f.agent_line(r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32000,"message":"no"}}"#);
    assert_eq!(
        answer_text(&mut from_b_number),
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"no"}}"#
    );
    assert_unanswered(&mut from_a);
    f.agent_line(r#"{"jsonrpc":"2.0","id":1,"result":{"who":"a"}}"#);
    assert_eq!(
        answer_text(&mut from_a),
        r#"{"jsonrpc":"2.0","id":1,"result":{"who":"a"}}"#
    );

    // Answers went to the POSTs, not to the streams; ids are free again.
    assert!(events(&a).is_empty());
    assert!(events(&b).is_empty());
    assert!(a.claim_request_id("1").is_ok(), "answered id released");
    assert!(b.claim_request_id(r#""1""#).is_ok(), "answered id released");
    assert!(b.claim_request_id("1").is_ok(), "answered id released");
    assert!(f.stdin_lines().is_empty(), "nothing more to the agent");
}

// 2. An answer whose POST is gone lands on the connection's SSE ring.
#[tokio::test]
async fn answer_for_a_gone_post_goes_to_the_connection_stream() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let other = f.open(json!({}));
    let (receiver, agent_id) = f
        .send_and_read_id(
            &a,
            r#""req-9""#,
            "authenticate",
            json!({}),
            Effect::None,
            None,
        )
        .await;
    drop(receiver);
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"ok":true}}}}"#
    ));
    assert_eq!(
        events(&a),
        [json!({"jsonrpc": "2.0", "id": "req-9", "result": {"ok": true}})]
    );
    assert_eq!(a.newest_event_id(), 1);
    assert!(events(&other).is_empty(), "only the requester's stream");
}

// 3. Session ownership and attachment.
#[tokio::test]
async fn session_new_registers_attaches_and_routes_updates_to_the_owner_only() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let b = f.open(json!({}));
    let (mut receiver, agent_id) = f.start_session_new(&a, "5").await;
    assert!(
        f.targets.sessions.get("mock", "s-1").is_none(),
        "not before the answer"
    );
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"sessionId":"s-1"}}}}"#
    ));

    let reply = answer(&mut receiver);
    assert_eq!(reply["id"], 5);
    assert_eq!(reply["result"]["sessionId"], "s-1");
    let meta = &reply["result"]["_meta"]["sandboxagent.dev"];
    assert_eq!(meta["agent"], AGENT);
    assert_eq!(meta["ended"], false);
    assert_eq!(meta["title"], "T", "metadata of the request is stored");

    let session = f.targets.sessions.get("mock", "s-1").expect("registered");
    assert_eq!(&*session.agent, AGENT);
    assert_eq!(session.process_generation, GENERATION);
    assert_eq!(session.cwd().as_deref(), Some("/work"));
    let attached = session.attached();
    assert_eq!(attached.len(), 1);
    assert!(Arc::ptr_eq(&attached[0], &a), "the requester is attached");
    assert_eq!(a.attached_sessions(), [Arc::<str>::from("s-1")]);
    assert!(b.attached_sessions().is_empty());

    f.agent_line(&update("s-1", 1));
    assert_eq!(events(&a), [value(&update("s-1", 1))]);
    assert!(events(&b).is_empty(), "same agent, not attached: nothing");

    let request = create_effect("5", &session_new_params());
    let Effect::CreateSession { request, .. } = request else {
        unreachable!("create_effect makes CreateSession")
    };
    let entries = log(&session);
    assert_eq!(entries.len(), 3, "{entries:?}");
    assert_eq!(
        entries[0],
        (
            Direction::ClientToAgent,
            serde_json::from_slice(&request).expect("json")
        )
    );
    assert_eq!(entries[1], (Direction::AgentToClient, reply));
    assert_eq!(
        entries[2],
        (Direction::AgentToClient, value(&update("s-1", 1)))
    );
    assert!(f.stdin_lines().is_empty());
}

/// The ring never parses a message: the router names the session whose
/// lane an event goes to. With a session lane open, the session's update
/// and its agent request land there, in order; a sessionless notification
/// stays on the connection's own lane.
#[tokio::test]
async fn the_router_puts_a_sessions_messages_in_its_lane() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let (mut receiver, agent_id) = f.start_session_new(&a, "5").await;
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"sessionId":"s-1"}}}}"#
    ));
    answer(&mut receiver);
    let mut lane = a.open_lane_stream(Some("s-1"), None).expect("session lane");
    let mut connection_lane = a.open_stream(None).expect("connection lane");
    let ask = r#"{"jsonrpc":"2.0","id":40,"method":"session/request_permission","params":{"sessionId":"s-1","options":[]}}"#;
    let note = r#"{"jsonrpc":"2.0","method":"_vendor/status","params":{"ok":true}}"#;
    f.agent_line(&update("s-1", 1));
    f.agent_line(ask);
    f.agent_line(note);
    let read = |stream: &mut crate::memory::connection::Stream| {
        let mut batch = Vec::new();
        stream.next_batch(&mut batch);
        batch
            .iter()
            .map(|m| serde_json::from_slice::<Value>(&m.json).expect("JSON"))
            .collect::<Vec<_>>()
    };
    assert_eq!(read(&mut lane), [value(&update("s-1", 1)), value(ask)]);
    assert_eq!(read(&mut connection_lane), [value(note)]);
}

// 4. Messages held until `session/new` is answered.
#[tokio::test]
async fn updates_before_the_session_new_answer_are_held_then_delivered_first() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let b = f.open(json!({}));
    let (receiver, agent_id) = f.start_session_new(&a, "1").await;
    f.agent_line(&update("s-1", 1));
    f.agent_line(&update("s-2", 2));
    f.agent_line(&update("s-1", 3));
    assert!(events(&a).is_empty(), "held, not delivered");
    assert!(events(&b).is_empty());
    // The POST is gone, so the answer goes to the ring too: after the updates.
    drop(receiver);
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"sessionId":"s-1"}}}}"#
    ));
    let ring = events(&a);
    assert_eq!(ring.len(), 3, "{ring:?}");
    assert_eq!(ring[0], value(&update("s-1", 1)));
    assert_eq!(ring[1], value(&update("s-1", 3)));
    assert_eq!(ring[2]["id"], 1);
    assert_eq!(ring[2]["result"]["sessionId"], "s-1");
    assert!(events(&b).is_empty(), "s-2's update is not s-1's");

    let session = f.targets.sessions.get("mock", "s-1").expect("registered");
    let entries: Vec<_> = log(&session).into_iter().map(|(_, m)| m).collect();
    assert_eq!(entries[0]["method"], "session/new");
    assert_eq!(entries[1..3], ring[..2], "held updates recorded, in order");
    assert_eq!(entries[3]["result"]["sessionId"], "s-1");
    assert_eq!(entries.len(), 4);

    // Later updates follow live.
    f.agent_line(&update("s-1", 4));
    assert_eq!(events(&a).len(), 4);

    // The message held for s-2 waits for its own owner.
    let (_receiver, agent_id) = f.start_session_new(&b, "1").await;
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"sessionId":"s-2"}}}}"#
    ));
    assert_eq!(events(&b), [value(&update("s-2", 2))]);
    assert_eq!(events(&a).len(), 4, "a got nothing of s-2");
}

#[tokio::test]
async fn held_messages_beyond_the_cap_drop_the_oldest() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let (mut receiver, agent_id) = f.start_session_new(&a, "1").await;
    for n in 0..=HELD_MAX {
        f.agent_line(&update("s-1", n));
    }
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"sessionId":"s-1"}}}}"#
    ));
    assert_eq!(answer(&mut receiver)["result"]["sessionId"], "s-1");
    let ns: Vec<usize> = events(&a).iter().map(update_n).collect();
    assert_eq!(ns, (1..=HELD_MAX).collect::<Vec<_>>(), "update 0 dropped");
    let session = f.targets.sessions.get("mock", "s-1").expect("registered");
    let logged = log(&session);
    assert_eq!(
        logged.len(),
        HELD_MAX + 2,
        "request, {HELD_MAX} updates, answer: the dropped one is not recorded"
    );
    assert_eq!(update_n(&logged[1].1), 1);
}

#[tokio::test]
async fn held_messages_older_than_the_ttl_are_dropped() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let stale = || {
        Instant::now()
            .checked_sub(HELD_TTL + Duration::from_millis(1))
            .expect("the clock is past the TTL")
    };
    let (mut receiver, agent_id) = f.start_session_new(&a, "1").await;
    // A stale head of the queue goes when the next message is held.
    f.agent_line(&update("s-1", 1));
    f.router.held.lock()[0].at = stale();
    f.agent_line(&update("s-1", 2));
    let held: Vec<usize> = f
        .router
        .held
        .lock()
        .iter()
        .map(|h| update_n(&serde_json::from_slice(&h.line).expect("json")))
        .collect();
    assert_eq!(held, [2]);
    // One that went stale while held is not delivered when the answer comes.
    f.agent_line(&update("s-1", 3));
    f.router.held.lock()[0].at = stale();
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"sessionId":"s-1"}}}}"#
    ));
    assert_eq!(answer(&mut receiver)["result"]["sessionId"], "s-1");
    let ns: Vec<usize> = events(&a).iter().map(update_n).collect();
    assert_eq!(ns, [3]);
    assert!(f.router.held.lock().is_empty(), "nothing left for s-1");
    let session = f.targets.sessions.get("mock", "s-1").expect("registered");
    assert_eq!(log(&session).len(), 3, "request, update 3, answer");
}

#[tokio::test]
async fn a_held_agent_request_is_delivered_once() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let (mut receiver, agent_id) = f.start_session_new(&a, "1").await;
    let ask = r#"{"jsonrpc":"2.0","id":"perm-1","method":"session/request_permission","params":{"sessionId":"s-1","options":[]}}"#;
    f.agent_line(&update("s-1", 1));
    f.agent_line(ask);
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"sessionId":"s-1"}}}}"#
    ));
    assert_eq!(answer(&mut receiver)["result"]["sessionId"], "s-1");
    assert_eq!(events(&a), [value(&update("s-1", 1)), value(ask)]);
    assert_eq!(
        f.router.take_agent_request(r#""perm-1""#),
        Some(Some("s-1".into()))
    );
    assert!(f.stdin_lines().is_empty());
}

/// Contract: held messages past either bound are "dropped (never delivered
/// or recorded)". An agent request dropped from the held queue leaves the
/// unanswered-requests table too, so the attach that follows does not
/// deliver it after the newer held messages.
#[tokio::test]
async fn a_held_agent_request_dropped_past_the_cap_is_not_delivered() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let (_receiver, agent_id) = f.start_session_new(&a, "1").await;
    f.agent_line(r#"{"jsonrpc":"2.0","id":"perm-0","method":"session/request_permission","params":{"sessionId":"s-1","options":[]}}"#);
    for n in 1..=HELD_MAX {
        f.agent_line(&update("s-1", n));
    }
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"sessionId":"s-1"}}}}"#
    ));
    let ring = events(&a);
    assert!(
        ring.iter().all(|event| event["id"] != "perm-0"),
        "dropped request delivered: {}",
        ring.last().map(Value::to_string).unwrap_or_default()
    );
    // … and the agent does not wait for it: answered `cancelled`.
    let answers: Vec<Value> = f
        .stdin_lines()
        .iter()
        .map(|line| value(line))
        .filter(|line| line["id"] == "perm-0")
        .collect();
    assert_eq!(
        answers,
        [
            json!({"jsonrpc": "2.0", "id": "perm-0", "result": {"outcome": {"outcome": "cancelled"}}})
        ]
    );
}

/// A question held for a session nobody owns and dropped past the cap is
/// answered `cancel` (research/contract.md, "Agent questions (ACP
/// elicitation)").
#[tokio::test]
async fn a_held_question_dropped_past_the_cap_is_answered_cancel() {
    let mut f = Fixture::new();
    f.agent_line(r#"{"jsonrpc":"2.0","id":"q-0","method":"elicitation/create","params":{"mode":"form","sessionId":"s-9","message":"m","requestedSchema":{"type":"object","properties":{}}}}"#);
    for n in 1..=HELD_MAX {
        f.agent_line(&update("s-9", n));
    }
    let answers: Vec<Value> = f.stdin_lines().iter().map(|line| value(line)).collect();
    assert_eq!(
        answers,
        [json!({"jsonrpc": "2.0", "id": "q-0", "result": {"action": "cancel"}})]
    );
}

/// A question goes only to controllers that declared its mode; with
/// controllers attached and none able to take it, the agent gets `cancel`
/// at once and the question is in the session's log with that answer.
#[tokio::test]
async fn questions_go_only_to_connections_that_declared_their_mode() {
    let mut f = Fixture::new();
    let form = f.open(json!({"elicitation": {"form": {}}}));
    let session = f.create_session(&form, "1", "s-1").await;
    let url = f.open(json!({"elicitation": {"url": {}}}));
    session.attach(&url);
    let _ = f.stdin_lines();
    let question = |id: &str, mode: &str| {
        let extra = if mode == "url" {
            r#""elicitationId":"e-1","url":"https://example.invalid/""#
        } else {
            r#""requestedSchema":{"type":"object","properties":{}}"#
        };
        format!(
            r#"{{"jsonrpc":"2.0","id":"{id}","method":"elicitation/create","params":{{"mode":"{mode}","sessionId":"s-1","message":"m",{extra}}}}}"#
        )
    };
    f.agent_line(&question("q-form", "form"));
    f.agent_line(&question("q-url", "url"));
    let ids = |connection: &Arc<Connection>| -> Vec<Value> {
        events(connection)
            .into_iter()
            .filter(|event| event["method"] == "elicitation/create")
            .map(|event| event["id"].clone())
            .collect()
    };
    assert_eq!(ids(&form), [json!("q-form")]);
    assert_eq!(ids(&url), [json!("q-url")]);
    assert!(f.stdin_lines().is_empty(), "nothing answered yet");

    session.detach(&url);
    f.agent_line(&question("q-url-2", "url"));
    assert_eq!(
        f.stdin_lines()
            .iter()
            .map(|line| value(line))
            .collect::<Vec<_>>(),
        [json!({"jsonrpc": "2.0", "id": "q-url-2", "result": {"action": "cancel"}})]
    );
    let logged: Vec<Value> = log(&session)
        .into_iter()
        .map(|(_, message)| message)
        .filter(|message| message["id"] == "q-url-2")
        .collect();
    assert_eq!(logged.len(), 2, "question and answer logged: {logged:?}");
}

// 5. Agent requests without a session: the most recent requester only.
#[tokio::test]
async fn sessionless_agent_requests_go_to_the_most_recent_requester_if_capable() {
    let mut f = Fixture::new();
    let reader = f.open(json!({"fs": {"readTextFile": true}}));
    let plain = f.open(json!({}));
    let _r1 = f
        .send(&reader, "1", "authenticate", json!({}), Effect::None, None)
        .await;
    let _r2 = f
        .send(&plain, "1", "authenticate", json!({}), Effect::None, None)
        .await;
    f.stdin_lines();

    // The most recent requester did not declare fs.readTextFile: -32601,
    // although an older one did.
    f.agent_line(
        r#"{"jsonrpc":"2.0","id":"r1","method":"fs/read_text_file","params":{"path":"/x"}}"#,
    );
    assert_eq!(
        f.stdin_one(),
        method_not_found(json!("r1"), "fs/read_text_file")
    );
    assert!(events(&reader).is_empty());
    assert!(events(&plain).is_empty());
    assert_eq!(
        f.router.take_agent_request(r#""r1""#),
        None,
        "answered already"
    );

    // A method that needs no capability goes to it, and only to it.
    let permission =
        r#"{"jsonrpc":"2.0","id":7,"method":"session/request_permission","params":{"options":[]}}"#;
    f.agent_line(permission);
    assert_eq!(events(&plain), [value(permission)]);
    assert!(events(&reader).is_empty());
    assert!(f.stdin_lines().is_empty());

    // Now the reader is the most recent requester.
    let _r3 = f
        .send(&reader, "2", "authenticate", json!({}), Effect::None, None)
        .await;
    f.stdin_lines();
    let read = r#"{"jsonrpc":"2.0","id":8,"method":"fs/read_text_file","params":{"path":"/y"}}"#;
    f.agent_line(read);
    assert_eq!(events(&reader), [value(read)]);
    assert_eq!(events(&plain), [value(permission)], "nothing new");
    assert!(f.stdin_lines().is_empty());
    assert_eq!(f.router.take_agent_request("8"), Some(None));
    assert_eq!(f.router.take_agent_request("7"), Some(None));

    // The most recent requester closed: nobody gets it, the agent gets -32601.
    f.targets.connections.close(&reader.id, &f.targets.sessions);
    f.agent_line(r#"{"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{}}"#);
    assert_eq!(
        f.stdin_one(),
        method_not_found(json!(9), "session/request_permission")
    );
    assert_eq!(
        events(&plain),
        [value(permission)],
        "not the older requester"
    );
}

#[tokio::test]
async fn sessionless_agent_request_with_no_requester_yet_is_refused() {
    let mut f = Fixture::new();
    let a = f.open(json!({"fs": {"readTextFile": true}, "terminal": true}));
    f.agent_line(r#"{"jsonrpc":"2.0","id":1,"method":"terminal/create","params":{}}"#);
    assert_eq!(f.stdin_one(), method_not_found(json!(1), "terminal/create"));
    assert!(events(&a).is_empty());
}

// 6. Agent requests of a session: capability gate, one answer.
#[tokio::test]
async fn session_agent_requests_respect_capabilities_and_are_taken_once() {
    let mut f = Fixture::new();
    let plain = f.open(json!({}));
    let writer = f.open(json!({"fs": {"writeTextFile": true}}));
    let session = f.create_session(&plain, "1", "s-1").await;

    let write = |id: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"fs/write_text_file","params":{{"sessionId":"s-1","path":"/a","content":"x"}}}}"#
        )
    };
    // Only `plain` is attached and it did not declare fs.writeTextFile.
    f.agent_line(&write(10));
    assert_eq!(
        f.stdin_one(),
        method_not_found(json!(10), "fs/write_text_file")
    );
    assert!(events(&plain).is_empty());
    assert_eq!(f.router.take_agent_request("10"), None);

    // A writer attaches (as `session/load` does before its answer).
    f.router.prepare_attach(&writer, "s-1");
    assert_eq!(session.attached().len(), 2);
    f.agent_line(&write(11));
    assert!(
        f.stdin_lines().is_empty(),
        "not refused: one attached declared it"
    );
    assert_eq!(events(&writer), [value(&write(11))]);
    assert!(
        events(&plain).is_empty(),
        "not to the one that did not declare it"
    );

    // A request that needs no capability goes to every attached connection.
    let permission = r#"{"jsonrpc":"2.0","id":12,"method":"session/request_permission","params":{"sessionId":"s-1","options":[]}}"#;
    f.agent_line(permission);
    assert_eq!(events(&plain), [value(permission)]);
    assert_eq!(events(&writer), [value(&write(11)), value(permission)]);

    // The first client answer takes the request; later ones are dropped.
    assert_eq!(f.router.take_agent_request("11"), Some(Some("s-1".into())));
    assert_eq!(f.router.take_agent_request("11"), None);
    assert_eq!(f.router.take_agent_request("12"), Some(Some("s-1".into())));
    assert_eq!(f.router.take_agent_request("12"), None);
    assert_eq!(f.router.take_agent_request("999"), None, "never existed");
}

// 6b. File and terminal requests the runtime serves.
#[tokio::test]
async fn the_runtime_answers_file_requests_unless_a_connection_opted_in() {
    let dir = std::env::temp_dir().join(format!("router-client-side-{}", std::process::id()));
    let data = dir.join("data");
    std::fs::create_dir_all(&data).expect("temp dirs");
    let mut f = Fixture::serving_files(&data);
    let plain = f.open(json!({}));
    let declared = f.open(json!({"fs": {"writeTextFile": true}}));
    let session = f.create_session(&plain, "1", "s-1").await;
    f.router.prepare_attach(&declared, "s-1");
    let write = |id: u32, path: &std::path::Path| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"fs/write_text_file","params":{{"sessionId":"s-1","path":{},"content":"x"}}}}"#,
            json!(path)
        )
    };

    // Declared without opting in: the runtime writes the file and answers.
    let target = dir.join("written.txt");
    f.agent_line(&write(10, &target));
    let answer = f.stdin_soon().await;
    assert_eq!(answer, json!({"jsonrpc": "2.0", "id": 10, "result": {}}));
    assert_eq!(std::fs::read(&target).expect("written"), b"x");
    assert!(events(&plain).is_empty() && events(&declared).is_empty());
    assert_eq!(
        f.router.take_agent_request("10"),
        None,
        "not filed for clients"
    );
    let logged: Vec<Value> = session
        .events(0, 100)
        .events
        .into_iter()
        .map(|event| event.message)
        .collect();
    assert_eq!(logged[logged.len() - 2]["method"], "fs/write_text_file");
    assert_eq!(logged[logged.len() - 1], answer, "the answer is logged");

    // Inside the data dir: refused.
    f.agent_line(&write(11, &data.join("x")));
    let refused = f.stdin_soon().await;
    assert_eq!(refused["error"]["code"], code::INVALID_PARAMS, "{refused}");
    assert!(!data.join("x").exists());

    // A connection that opted in and declared it takes it, as any request.
    let taker = f.open_serving(json!({"fs": {"writeTextFile": true}}));
    f.router.prepare_attach(&taker, "s-1");
    f.agent_line(&write(12, &target));
    assert_eq!(events(&taker), [value(&write(12, &target))]);
    assert!(events(&declared).is_empty());
    assert!(f.stdin_lines().is_empty(), "the runtime did not answer it");
    assert_eq!(f.router.take_agent_request("12"), Some(Some("s-1".into())));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_waiting_session_request_reaches_the_next_connection_that_attaches() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let b = f.open(json!({}));
    let session = f.create_session(&a, "1", "s-1").await;
    assert!(session.detach(&a));
    let ask = r#"{"jsonrpc":"2.0","id":"p","method":"session/request_permission","params":{"sessionId":"s-1","options":[]}}"#;
    f.agent_line(ask);
    assert!(f.stdin_lines().is_empty(), "nobody attached: it waits");
    assert!(events(&a).is_empty());

    // `b` loads the session: attached early, history replay reaches it.
    let effect = Effect::AttachSession {
        session: "s-1".to_owned(),
        cwd: Some("/work".to_owned()),
        request: Bytes::from_static(b"{}"),
    };
    f.router.prepare_attach(&b, "s-1");
    let (mut receiver, agent_id) = f
        .send_and_read_id(
            &b,
            "4",
            "session/load",
            json!({"sessionId": "s-1", "cwd": "/work", "mcpServers": []}),
            effect,
            Some("s-1"),
        )
        .await;
    f.agent_line(&update("s-1", 1));
    assert_eq!(
        events(&b),
        [value(&update("s-1", 1))],
        "replay before the answer"
    );
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{}}}}"#
    ));
    assert_eq!(answer(&mut receiver)["id"], 4);
    assert_eq!(events(&b), [value(&update("s-1", 1)), value(ask)]);
    assert!(events(&a).is_empty());
    assert_eq!(
        f.router.take_agent_request(r#""p""#),
        Some(Some("s-1".into()))
    );
}

#[tokio::test]
async fn a_failed_load_undoes_the_early_attach() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let b = f.open(json!({}));
    let session = f.create_session(&a, "1", "s-1").await;
    f.router.prepare_attach(&b, "s-1");
    let effect = Effect::AttachSession {
        session: "s-1".to_owned(),
        cwd: None,
        request: Bytes::from_static(b"{}"),
    };
    let (mut receiver, agent_id) = f
        .send_and_read_id(
            &b,
            "2",
            "session/load",
            json!({"sessionId": "s-1"}),
            effect,
            Some("s-1"),
        )
        .await;
    assert_eq!(session.attached().len(), 2);
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"error":{{"code":-32002,"message":"nope"}}}}"#
    ));
    assert_eq!(
        answer(&mut receiver),
        json!({"jsonrpc": "2.0", "id": 2, "error": {"code": -32002, "message": "nope"}})
    );
    let attached = session.attached();
    assert_eq!(attached.len(), 1);
    assert!(Arc::ptr_eq(&attached[0], &a));
    assert!(b.attached_sessions().is_empty());
}

/// Contract, "Agent errors: stderr and hint": an error answer waits for
/// the stderr reader, then carries only the lines written after its
/// request was forwarded (the agent's `data` kept, wrapped) and, for a
/// failed `session/new` of a root server, the hint. A success is relayed
/// at once, untouched.
#[tokio::test]
async fn an_error_answer_carries_the_stderr_since_its_request() {
    let mut f = Fixture::new();
    let capture = Arc::new(StderrCapture::default());
    f.router.set_stderr(capture.clone());
    f.router.set_root_hint(true);
    let a = f.open(json!({}));
    capture.push("before the request".to_owned());
    let (mut receiver, agent_id) = f.start_session_new(&a, "1").await;
    capture.push("after it".to_owned());
    let deferred = f.router.dispatch(Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"error":{{"code":-32603,"message":"no","data":"why"}}}}"#
    )));
    assert_unanswered(&mut receiver);
    deferred
        .expect("an error answer is deferred")
        .deliver(&f.router)
        .await;
    let reply = answer(&mut receiver);
    let data = &reply["error"]["data"];
    assert_eq!(data["agent"], "why", "{reply}");
    assert_eq!(
        data["sandboxagent.dev"]["stderr"],
        json!(["after it"]),
        "{reply}"
    );
    let hint = data["sandboxagent.dev"]["hint"]
        .as_str()
        .unwrap_or_default();
    assert!(hint.contains("--agent-user USER"), "{reply}");

    let (mut receiver, agent_id) = f.start_session_new(&a, "2").await;
    capture.push("during a success".to_owned());
    let deferred = f.router.dispatch(Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"sessionId":"s-2"}}}}"#
    )));
    assert!(deferred.is_none(), "a success is not held");
    let reply = answer(&mut receiver);
    assert_eq!(reply["result"]["sessionId"], "s-2");
}

/// Contract: "with nobody attached they wait, and the next connection that
/// attaches gets them" and "When no target declared it, the runtime answers
/// the agent -32601". A connection without the capability that attaches
/// while a capable one already holds the request must not refuse it on the
/// capable one's behalf.
#[tokio::test]
async fn attaching_without_the_capability_does_not_refuse_a_delivered_request() {
    let mut f = Fixture::new();
    let writer = f.open(json!({"fs": {"writeTextFile": true}}));
    let plain = f.open(json!({}));
    f.create_session(&writer, "1", "s-1").await;
    let write = r#"{"jsonrpc":"2.0","id":30,"method":"fs/write_text_file","params":{"sessionId":"s-1","path":"/a","content":"x"}}"#;
    f.agent_line(write);
    assert_eq!(events(&writer), [value(write)]);
    // `plain` loads the session.
    let effect = Effect::AttachSession {
        session: "s-1".to_owned(),
        cwd: None,
        request: Bytes::from_static(b"{}"),
    };
    f.router.prepare_attach(&plain, "s-1");
    let (_receiver, agent_id) = f
        .send_and_read_id(
            &plain,
            "1",
            "session/load",
            json!({"sessionId": "s-1"}),
            effect,
            Some("s-1"),
        )
        .await;
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{}}}}"#
    ));
    assert!(
        f.stdin_lines().is_empty(),
        "the agent was told -32601 although the writer holds the request"
    );
    assert_eq!(
        f.router.take_agent_request("30"),
        Some(Some("s-1".into())),
        "the writer's answer must still reach the agent"
    );
}

// 7. Late agent answers.
#[tokio::test]
async fn unknown_and_repeated_agent_answers_are_dropped() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let (mut receiver, agent_id) = f
        .send_and_read_id(&a, "1", "authenticate", json!({}), Effect::None, None)
        .await;
    f.agent_line(r#"{"jsonrpc":"2.0","id":99,"result":{}}"#);
    f.agent_line(r#"{"jsonrpc":"2.0","id":"1","result":{}}"#);
    f.agent_line(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}"#);
    assert_unanswered(&mut receiver);
    assert!(events(&a).is_empty());

    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"n":1}}}}"#
    ));
    assert_eq!(
        answer(&mut receiver),
        json!({"jsonrpc": "2.0", "id": 1, "result": {"n": 1}})
    );
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"n":2}}}}"#
    ));
    assert!(events(&a).is_empty(), "the repeat reaches no stream");
    assert!(f.stdin_lines().is_empty());
}

// 8. Process exit fan-out.
#[tokio::test]
async fn process_exit_fails_pending_requests_and_ends_live_sessions() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let b = f.open(json!({}));
    let bystander = f.open(json!({}));
    let session = f.create_session(&a, "1", "s-1").await;
    let (mut prompt, prompt_agent_id) = f
        .send_and_read_id(
            &a,
            r#""p-1""#,
            "session/prompt",
            json!({"sessionId": "s-1", "prompt": []}),
            Effect::None,
            Some("s-1"),
        )
        .await;
    let (gone, _) = f
        .send_and_read_id(&b, "4", "authenticate", json!({}), Effect::None, None)
        .await;
    drop(gone);
    let ask = r#"{"jsonrpc":"2.0","id":20,"method":"session/request_permission","params":{"sessionId":"s-1","options":[]}}"#;
    f.agent_line(ask);
    f.agent_line(&update("s-9", 1));

    let stderr = StderrExcerpt {
        head: Some("starting".to_owned()),
        tail: Some("boom".to_owned()),
        truncated: false,
        total_lines: Some(2),
    };
    f.router
        .finish(
            ExitInfo {
                code: Some(1),
                signal: None,
            },
            stderr,
        )
        .await;

    let message = "agent process exited (exit code 1)";
    let stderr_json =
        json!({"head": "starting", "tail": "boom", "truncated": false, "totalLines": 2});
    let error = json!({
        "code": -32603,
        "message": message,
        "data": {"agent": AGENT, "exitCode": 1, "signal": null, "stderr": stderr_json},
    });
    assert_eq!(
        answer(&mut prompt),
        json!({"jsonrpc": "2.0", "id": "p-1", "error": error})
    );
    assert_eq!(
        events(&b),
        [json!({"jsonrpc": "2.0", "id": 4, "error": error})],
        "the gone POST's failure lands on its stream"
    );
    let ended = json!({
        "jsonrpc": "2.0",
        "method": SESSION_ENDED,
        "params": {
            "sessionId": "s-1",
            "reason": "error",
            "terminatedBy": "agent",
            "message": message,
            "exitCode": 1,
            "stderr": stderr_json,
        },
    });
    assert_eq!(events(&a), [value(ask), ended.clone()]);
    assert!(events(&bystander).is_empty());
    assert!(session.is_ended());
    assert!(session.attached().is_empty());
    assert!(a.attached_sessions().is_empty());
    assert!(
        f.targets
            .sessions
            .live_of_process(AGENT, GENERATION)
            .is_empty()
    );
    // The end notice, then the failed prompt's answer (every answer is
    // in the log).
    let logged = log(&session);
    assert_eq!(
        logged[logged.len() - 2..],
        [
            (Direction::AgentToClient, ended),
            (
                Direction::AgentToClient,
                json!({"jsonrpc": "2.0", "id": "p-1", "error": error})
            ),
        ]
    );

    // Agent requests and held messages are forgotten; late lines go nowhere.
    assert_eq!(f.router.take_agent_request("20"), None);
    assert!(f.router.held.lock().is_empty());
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{prompt_agent_id},"result":{{"stopReason":"end_turn"}}}}"#
    ));
    assert_eq!(events(&a).len(), 2);
    assert!(f.stdin_lines().is_empty());
}

#[tokio::test]
async fn a_clean_exit_ends_sessions_as_completed() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let session = f.create_session(&a, "1", "s-1").await;
    f.router
        .finish(
            ExitInfo {
                code: Some(0),
                signal: None,
            },
            StderrExcerpt::default(),
        )
        .await;
    let ring = events(&a);
    assert_eq!(ring.len(), 1);
    assert_eq!(ring[0]["method"], SESSION_ENDED);
    assert_eq!(ring[0]["params"]["reason"], "completed");
    assert_eq!(ring[0]["params"]["terminatedBy"], "agent");
    assert_eq!(ring[0]["params"]["exitCode"], 0);
    assert!(session.is_ended());
}

// 9. `abandon_prompts`.
#[tokio::test]
async fn abandon_prompts_cancels_only_that_sessions_prompts() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let session = f.create_session(&a, "1", "s-1").await;
    let (mut prompt, prompt_agent_id) = f
        .send_and_read_id(
            &a,
            "11",
            "session/prompt",
            json!({"sessionId": "s-1", "prompt": []}),
            Effect::None,
            Some("s-1"),
        )
        .await;
    let (mut set_mode, set_mode_agent_id) = f
        .send_and_read_id(
            &a,
            "12",
            "session/set_mode",
            json!({"sessionId": "s-1", "modeId": "plan"}),
            Effect::None,
            Some("s-1"),
        )
        .await;
    let (mut other_prompt, _) = f
        .send_and_read_id(
            &a,
            "13",
            "session/prompt",
            json!({"sessionId": "s-2", "prompt": []}),
            Effect::None,
            Some("s-2"),
        )
        .await;

    assert_eq!(f.router.abandon_prompts("s-1"), 1);
    let cancelled = json!({"jsonrpc": "2.0", "id": 11, "result": {"stopReason": "cancelled"}});
    assert_eq!(answer(&mut prompt), cancelled);
    assert_unanswered(&mut set_mode);
    assert_unanswered(&mut other_prompt);
    assert_eq!(f.router.agent_id_of(&a, "11"), None);
    assert_eq!(f.router.agent_id_of(&a, "12"), Some(set_mode_agent_id));
    assert_eq!(
        log(&session).last(),
        Some(&(Direction::AgentToClient, cancelled))
    );
    assert_eq!(
        f.router.abandon_prompts("s-1"),
        0,
        "nothing left to abandon"
    );

    // The agent's own late end of the turn is dropped.
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{prompt_agent_id},"result":{{"stopReason":"end_turn"}}}}"#
    ));
    assert!(events(&a).is_empty());
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{set_mode_agent_id},"result":{{}}}}"#
    ));
    assert_eq!(
        answer(&mut set_mode),
        json!({"jsonrpc": "2.0", "id": 12, "result": {}})
    );
    assert!(f.stdin_lines().is_empty());
}

// 10. `$/cancel_request` translation.
#[tokio::test]
async fn agent_id_of_finds_only_that_connections_request() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let b = f.open(json!({}));
    let (_a1, a1) = f
        .send_and_read_id(&a, "1", "authenticate", json!({}), Effect::None, None)
        .await;
    let (_b1, b1) = f
        .send_and_read_id(&b, "1", "authenticate", json!({}), Effect::None, None)
        .await;
    let (_ax, ax) = f
        .send_and_read_id(&a, r#""x""#, "authenticate", json!({}), Effect::None, None)
        .await;
    assert_eq!((a1, b1, ax), (1, 2, 3));
    assert_eq!(f.router.agent_id_of(&a, "1"), Some(1));
    assert_eq!(f.router.agent_id_of(&b, "1"), Some(2));
    assert_eq!(f.router.agent_id_of(&a, r#""x""#), Some(3));
    assert_eq!(f.router.agent_id_of(&b, r#""x""#), None, "a's id, not b's");
    assert_eq!(
        f.router.agent_id_of(&a, r#""1""#),
        None,
        "raw JSON: \"1\" is not 1"
    );
    assert_eq!(
        f.router.agent_id_of(&a, "2"),
        None,
        "client ids, not agent ids"
    );
    f.agent_line(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
    assert_eq!(f.router.agent_id_of(&a, "1"), None, "answered");
    assert_eq!(f.router.agent_id_of(&b, "1"), Some(2));
}

// 11. Unparsable lines.
#[tokio::test]
async fn unparsable_lines_are_reported_to_every_connection_of_the_agent() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let b = f.open(json!({}));
    let other_agent = f.open_for("other", json!({}));
    f.agent_line("   ");
    f.agent_line("");
    assert!(events(&a).is_empty(), "blank lines are ignored");

    f.agent_line("not json at all");
    let notice = json!({
        "jsonrpc": "2.0",
        "method": AGENT_UNPARSED,
        "params": {"agent": AGENT, "raw": "not json at all", "error": "not a JSON object: expected an object"},
    });
    assert_eq!(events(&a), [notice]);
    assert_eq!(events(&b), events(&a), "the same notice to each");
    assert!(events(&other_agent).is_empty());

    f.agent_line(r#"{"jsonrpc":"2.0","id":1}"#);
    let ring = events(&a);
    assert_eq!(ring.len(), 2);
    assert_eq!(ring[1]["method"], "_sandboxagent/agent/unparsed");
    assert_eq!(ring[1]["params"]["raw"], r#"{"jsonrpc":"2.0","id":1}"#);
    assert!(
        ring[1]["params"]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("not a JSON-RPC request")),
        "{}",
        ring[1]
    );

    let long = "x".repeat(PREFIX_BYTES + 10);
    f.agent_line(&long);
    let ring = events(&b);
    assert_eq!(ring.len(), 3);
    assert_eq!(
        ring[2]["params"]["raw"],
        format!("{}…", "x".repeat(PREFIX_BYTES))
    );
    assert_eq!(
        ring[2]["params"]["error"],
        format!(
            "not a JSON object: expected an object (line of {} bytes, cut)",
            PREFIX_BYTES + 10
        )
    );
    assert!(f.stdin_lines().is_empty(), "the agent hears nothing of it");
}

// Beyond the list: session-less notifications, the agent's own
// `$/cancel_request`, and the runtime's own requests.
#[tokio::test]
async fn sessionless_notifications_go_to_every_connection_of_the_agent() {
    let f = Fixture::new();
    let a = f.open(json!({}));
    let b = f.open(json!({}));
    let other_agent = f.open_for("other", json!({}));
    let note = r#"{"jsonrpc":"2.0","method":"_vendor/status","params":{"ok":true}}"#;
    f.agent_line(note);
    assert_eq!(events(&a), [value(note)]);
    assert_eq!(events(&b), [value(note)]);
    assert!(events(&other_agent).is_empty());
}

#[tokio::test]
async fn agent_cancel_request_reaches_the_session_and_drops_later_answers() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let b = f.open(json!({}));
    f.create_session(&a, "1", "s-1").await;
    let ask = r#"{"jsonrpc":"2.0","id":"q","method":"session/request_permission","params":{"sessionId":"s-1","options":[]}}"#;
    let cancel = r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"q"}}"#;
    f.agent_line(ask);
    f.agent_line(cancel);
    assert_eq!(events(&a), [value(ask), value(cancel)]);
    assert!(events(&b).is_empty());
    assert_eq!(
        f.router.take_agent_request(r#""q""#),
        None,
        "a later answer is dropped"
    );
    // A cancel of a request already answered goes nowhere.
    f.agent_line(cancel);
    assert_eq!(events(&a).len(), 2);
}

/// Reads the runtime's `initialize` call from stdin and answers it with
/// `member` (`"result":…` or `"error":…`).
async fn answer_call(router: &Router, stdin: &mut mpsc::Receiver<Bytes>, member: &str) {
    let line = stdin.recv().await.expect("the call was written");
    let sent: Value = serde_json::from_slice(&line).expect("json");
    assert_eq!(sent["method"], "initialize");
    assert_eq!(sent["params"], json!({"protocolVersion": 1}));
    let id = &sent["id"];
    let _ = router.dispatch(Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":{id},{member}}}"#
    )));
}

#[tokio::test]
async fn runtime_calls_get_the_raw_result_or_error() {
    let mut f = Fixture::new();
    let Fixture { router, stdin, .. } = &mut f;
    let params = json!({"protocolVersion": 1});
    let (outcome, ()) = tokio::join!(
        router.call("initialize", &params),
        answer_call(router, stdin, r#""result":{"protocolVersion": 1}"#)
    );
    assert_eq!(
        outcome
            .map(Box::<str>::from)
            .map_err(|e| e.map(Box::<str>::from)),
        Ok(r#"{"protocolVersion": 1}"#.into())
    );
    let (outcome, ()) = tokio::join!(
        router.call("initialize", &params),
        answer_call(router, stdin, r#""error":{"code":-32000,"message":"auth"}"#)
    );
    assert_eq!(
        outcome
            .map(Box::<str>::from)
            .map_err(|e| e.map(Box::<str>::from)),
        Err(Some(r#"{"code":-32000,"message":"auth"}"#.into()))
    );
}

#[tokio::test]
async fn runtime_call_pending_at_exit_reports_the_exit() {
    let mut f = Fixture::new();
    let Fixture { router, stdin, .. } = &mut f;
    let params = json!({});
    let exit = async {
        stdin.recv().await.expect("the call was written");
        router
            .finish(ExitInfo::default(), StderrExcerpt::default())
            .await;
    };
    let (outcome, ()) = tokio::join!(router.call("initialize", &params), exit);
    assert!(matches!(outcome, Err(None)), "{outcome:?}");
}

#[tokio::test]
async fn observers_get_updates_but_no_agent_requests_and_their_answers_are_dropped() {
    let mut f = Fixture::new();
    let controller = f.open(json!({}));
    let observer = f.open(json!({}));
    let session = f.create_session(&controller, "1", "s-1").await;
    let attached = session.attach_with_history(
        &observer,
        Role::Observer,
        None,
        &crate::memory::session::FromStore::default(),
    );
    assert!(matches!(
        attached,
        crate::memory::session::AttachOutcome::Attached { replayed: 0, .. }
    ));
    let ask = r#"{"jsonrpc":"2.0","id":"q","method":"session/request_permission","params":{"sessionId":"s-1","options":[]}}"#;
    f.agent_line(&update("s-1", 1));
    f.agent_line(ask);
    assert_eq!(events(&observer), [value(&update("s-1", 1))]);
    assert_eq!(events(&controller).last(), Some(&value(ask)));
    assert!(
        f.router.take_answered(r#""q""#, &observer).is_none(),
        "an observer's answer is dropped"
    );
    let answered = f
        .router
        .take_answered(r#""q""#, &controller)
        .expect("the controller's answer wins");
    f.router.announce_resolved(
        &answered,
        &controller,
        br#"{"jsonrpc":"2.0","id":"q","result":{"outcome":{"outcome":"selected","optionId":"allow-once"}}}"#,
    );
    assert_eq!(
        events(&observer).last(),
        Some(
            &json!({"jsonrpc": "2.0", "method": "_sandboxagent/request/resolved",
            "params": {"sessionId": "s-1", "requestId": "q", "outcome": {"outcome": "selected", "optionId": "allow-once"}}})
        )
    );
    assert!(
        events(&controller)
            .iter()
            .all(|e| e["method"] != "_sandboxagent/request/resolved"),
        "the winner is not told"
    );
    assert!(f.router.take_answered(r#""q""#, &controller).is_none());
    assert!(f.stdin_lines().is_empty());
}

#[tokio::test]
async fn a_sessionless_cancel_goes_to_the_connection_that_got_the_request() {
    let mut f = Fixture::new();
    let first = f.open(json!({}));
    let second = f.open(json!({}));
    let _r1 = f
        .send(&first, "1", "authenticate", json!({}), Effect::None, None)
        .await;
    let ask = r#"{"jsonrpc":"2.0","id":"q","method":"_x/ask","params":{}}"#;
    f.agent_line(ask);
    let _r2 = f
        .send(&second, "1", "authenticate", json!({}), Effect::None, None)
        .await;
    f.stdin_lines();
    let cancel = r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"q"}}"#;
    f.agent_line(cancel);
    assert_eq!(events(&first), [value(ask), value(cancel)]);
    assert!(events(&second).is_empty(), "not the latest requester");
}

#[tokio::test]
async fn an_ended_sessions_open_requests_are_answered_cancelled() {
    let mut f = Fixture::new();
    let a = f.open(json!({"fs": {"readTextFile": true}}));
    f.create_session(&a, "1", "s-1").await;
    f.agent_line(r#"{"jsonrpc":"2.0","id":5,"method":"session/request_permission","params":{"sessionId":"s-1","options":[]}}"#);
    f.agent_line(r#"{"jsonrpc":"2.0","id":6,"method":"fs/read_text_file","params":{"sessionId":"s-1","path":"/x"}}"#);
    assert_eq!(f.router.cancel_session_requests("s-1"), 2);
    let answers: Vec<Value> = f.stdin_lines().iter().map(|l| value(l)).collect();
    assert_eq!(
        answers[0],
        json!({"jsonrpc": "2.0", "id": 5, "result": {"outcome": {"outcome": "cancelled"}}})
    );
    assert_eq!(answers[1]["id"], 6);
    assert_eq!(answers[1]["error"]["code"], code::REQUEST_CANCELLED);
    let resolved: Vec<Value> = events(&a)
        .into_iter()
        .filter(|e| e["method"] == "_sandboxagent/request/resolved")
        .map(|e| e["params"]["requestId"].clone())
        .collect();
    assert_eq!(resolved, [json!(5), json!(6)]);
    assert_eq!(f.router.take_agent_request("5"), None);
    assert_eq!(f.router.cancel_session_requests("s-1"), 0);
}

/// Only a connection a request went to answers it: an agent that uses one
/// id in two sessions gets each session's own answer, and a connection
/// that never saw a request cannot answer it.
#[tokio::test]
async fn only_a_connection_that_got_a_request_answers_it() {
    let mut f = Fixture::new();
    let a = f.open(json!({"elicitation": {"form": {}}}));
    let b = f.open(json!({"elicitation": {"form": {}}}));
    f.create_session(&a, "1", "s-1").await;
    f.create_session(&b, "1", "s-2").await;
    let question = |session: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":"dup","method":"elicitation/create","params":{{"mode":"form","sessionId":"{session}","message":"m","requestedSchema":{{"type":"object","properties":{{}}}}}}}}"#
        )
    };
    f.agent_line(&question("s-1"));
    f.agent_line(&question("s-2"));
    let stranger = f.open(json!({"elicitation": {"form": {}}}));
    assert!(f.router.take_answered(r#""dup""#, &stranger).is_none());
    let answered = f
        .router
        .take_answered(r#""dup""#, &b)
        .expect("b's own question");
    assert_eq!(answered.session.as_deref(), Some("s-2"));
    let answered = f
        .router
        .take_answered(r#""dup""#, &a)
        .expect("a's own question");
    assert_eq!(answered.session.as_deref(), Some("s-1"));
}

/// A request to an ended session is answered at once (nobody can attach
/// to it any more), and past `AGENT_REQUESTS_MAX` open requests a new one
/// is answered as cancelled.
#[tokio::test]
async fn requests_nobody_can_answer_are_answered_at_once() {
    let mut f = Fixture::new();
    let a = f.open(json!({"elicitation": {"form": {}}}));
    let session = f.create_session(&a, "1", "s-1").await;
    session.end(EndReason::Terminated);
    f.stdin_lines();
    f.agent_line(r#"{"jsonrpc":"2.0","id":"late","method":"elicitation/create","params":{"mode":"form","sessionId":"s-1","message":"m","requestedSchema":{"type":"object","properties":{}}}}"#);
    assert_eq!(
        f.stdin_lines().iter().map(|l| value(l)).collect::<Vec<_>>(),
        [json!({"jsonrpc": "2.0", "id": "late", "result": {"action": "cancel"}})]
    );
    // Nor does the runtime act for it: a file request is refused.
    f.agent_line(r#"{"jsonrpc":"2.0","id":"fs","method":"fs/read_text_file","params":{"sessionId":"s-1","path":"/etc/hostname"}}"#);
    let refused = f.stdin_lines().iter().map(|l| value(l)).collect::<Vec<_>>();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["error"]["code"], -32800, "{refused:?}");

    let b = f.open(json!({}));
    f.create_session(&b, "2", "s-2").await;
    f.stdin_lines();
    for n in 0..AGENT_REQUESTS_MAX {
        f.agent_line(&format!(
            r#"{{"jsonrpc":"2.0","id":{n},"method":"session/request_permission","params":{{"sessionId":"s-2","options":[]}}}}"#
        ));
    }
    assert!(f.stdin_lines().is_empty(), "all open, none answered");
    f.agent_line(r#"{"jsonrpc":"2.0","id":"one-too-many","method":"session/request_permission","params":{"sessionId":"s-2","options":[]}}"#);
    assert_eq!(
        f.stdin_lines().iter().map(|l| value(l)).collect::<Vec<_>>(),
        [
            json!({"jsonrpc": "2.0", "id": "one-too-many", "result": {"outcome": {"outcome": "cancelled"}}})
        ]
    );
    // Terminating answers every one of them, past the stdin queue's size.
    assert_eq!(f.router.cancel_session_requests("s-2"), AGENT_REQUESTS_MAX);
    let mut answered = 0;
    while answered < AGENT_REQUESTS_MAX {
        tokio::time::timeout(Duration::from_secs(5), f.stdin.recv())
            .await
            .expect("every request answered")
            .expect("stdin open");
        answered += 1;
    }
}

/// A request-scoped question is answered `cancel` once the request it
/// belongs to is answered, or once its connection closed (the sweep).
#[tokio::test]
async fn a_request_scoped_question_ends_with_its_request_or_connection() {
    let mut f = Fixture::new();
    let a = f.open(json!({"elicitation": {"form": {}}}));
    let (_reply, agent_id) = f
        .send_and_read_id(
            &a,
            "\"auth\"",
            "authenticate",
            json!({}),
            Effect::None,
            None,
        )
        .await;
    let ask = |id: &str, scope: i64| {
        format!(
            r#"{{"jsonrpc":"2.0","id":"{id}","method":"elicitation/create","params":{{"mode":"form","requestId":{scope},"message":"m","requestedSchema":{{"type":"object","properties":{{}}}}}}}}"#
        )
    };
    f.agent_line(&ask("q-1", agent_id));
    let delivered = events(&a);
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0]["params"]["requestId"], "auth");
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{}}}}"#
    ));
    assert_eq!(
        f.stdin_lines().iter().map(|l| value(l)).collect::<Vec<_>>(),
        [json!({"jsonrpc": "2.0", "id": "q-1", "result": {"action": "cancel"}})]
    );

    let (_reply, agent_id) = f
        .send_and_read_id(
            &a,
            "\"auth-2\"",
            "authenticate",
            json!({}),
            Effect::None,
            None,
        )
        .await;
    f.agent_line(&ask("q-2", agent_id));
    f.stdin_lines();
    a.close();
    f.router.sweep();
    assert_eq!(
        f.stdin_lines().iter().map(|l| value(l)).collect::<Vec<_>>(),
        [json!({"jsonrpc": "2.0", "id": "q-2", "result": {"action": "cancel"}})]
    );
}

/// A question held for a session not known yet goes, once the session is,
/// only to a connection that declared its mode; the owner that did not is
/// not sent it, and the agent gets `cancel`.
#[tokio::test]
async fn a_held_question_is_not_flushed_to_a_connection_without_its_mode() {
    let mut f = Fixture::new();
    let a = f.open(json!({}));
    let (_receiver, agent_id) = f.start_session_new(&a, "1").await;
    f.agent_line(r#"{"jsonrpc":"2.0","id":"q","method":"elicitation/create","params":{"mode":"form","sessionId":"s-1","message":"m","requestedSchema":{"type":"object","properties":{}}}}"#);
    f.agent_line(&update("s-1", 1));
    f.stdin_lines();
    f.agent_line(&format!(
        r#"{{"jsonrpc":"2.0","id":{agent_id},"result":{{"sessionId":"s-1"}}}}"#
    ));
    let ring = events(&a);
    assert!(
        ring.iter()
            .all(|event| event["method"] != "elicitation/create"),
        "{ring:?}"
    );
    assert!(ring.contains(&value(&update("s-1", 1))), "{ring:?}");
    assert_eq!(
        f.stdin_lines().iter().map(|l| value(l)).collect::<Vec<_>>(),
        [json!({"jsonrpc": "2.0", "id": "q", "result": {"action": "cancel"}})]
    );
}
