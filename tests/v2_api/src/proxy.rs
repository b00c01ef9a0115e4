//! A loopback TCP proxy in front of a server, for drop-and-resume tests.
//!
//! It forwards bytes both ways untouched, notes the head of every HTTP
//! request it sees (verb, connection id, `Last-Event-ID`), and can cut
//! every open TCP connection on demand (both sides see the connection
//! close), hold new ones before they reach the server, or refuse them.
//! Used by the bridge tests here and by `acp-http-client`'s resume tests.
//! [`ResponseCut`] instead breaks off one answer midway (a download cut
//! after N bytes), for the resumed-download tests.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::CONNECTION_ID_HEADER;

/// The head of one HTTP request that went through the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// `GET`, `POST`, `DELETE`, ….
    pub method: String,
    /// The `x-acp-connection-id` header, if any.
    pub connection_id: Option<String>,
    /// The `Last-Event-ID` header, if any.
    pub last_event_id: Option<String>,
}

/// A proxy to one upstream address; cheap to clone.
#[derive(Clone)]
pub struct CutProxy {
    addr: SocketAddr,
    state: Arc<State>,
}

struct State {
    upstream: String,
    /// Forwarding tasks of the connections accepted so far.
    connections: Mutex<Vec<JoinHandle<()>>>,
    /// Every request head seen, in order.
    heads: Mutex<Vec<RequestHead>>,
    /// While set, new connections are closed as soon as they arrive.
    refuse: AtomicBool,
    /// While `true`, new connections wait before being forwarded.
    hold: watch::Sender<bool>,
    /// TCP connections accepted so far (refused ones included).
    accepted: AtomicUsize,
}

impl CutProxy {
    /// Starts a proxy on `127.0.0.1:0` forwarding to `upstream`
    /// (`127.0.0.1:PORT`).
    ///
    /// # Panics
    /// If the listener cannot be bound.
    pub async fn start(upstream: &str) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let state = Arc::new(State {
            upstream: upstream.to_owned(),
            connections: Mutex::new(Vec::new()),
            heads: Mutex::new(Vec::new()),
            refuse: AtomicBool::new(false),
            hold: watch::Sender::new(false),
            accepted: AtomicUsize::new(0),
        });
        let accept_state = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                accept_state.accepted.fetch_add(1, Ordering::Relaxed);
                if accept_state.refuse.load(Ordering::Relaxed) {
                    drop(client);
                    continue;
                }
                let task = tokio::spawn(forward(Arc::clone(&accept_state), client));
                if let Ok(mut connections) = accept_state.connections.lock() {
                    connections.retain(|task| !task.is_finished());
                    connections.push(task);
                }
            }
        });
        CutProxy { addr, state }
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Drops every connection open now; returns how many were open.
    pub fn cut(&self) -> usize {
        let tasks: Vec<_> = match self.state.connections.lock() {
            Ok(mut connections) => connections.drain(..).collect(),
            Err(_) => Vec::new(),
        };
        let open = tasks.iter().filter(|task| !task.is_finished()).count();
        for task in tasks {
            task.abort();
        }
        open
    }

    /// Closes (or stops closing) every connection accepted from now on.
    pub fn refuse(&self, refuse: bool) {
        self.state.refuse.store(refuse, Ordering::Relaxed);
    }

    /// Holds (or releases) connections accepted from now on: they wait
    /// before reaching the server.
    pub fn hold(&self, hold: bool) {
        self.state.hold.send_replace(hold);
    }

    /// TCP connections accepted so far, refused ones included.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::Relaxed)
    }

    /// The request heads seen so far.
    pub fn heads(&self) -> Vec<RequestHead> {
        self.state
            .heads
            .lock()
            .map(|heads| heads.clone())
            .unwrap_or_default()
    }

    /// The first connection id any request carried.
    pub fn connection_id(&self) -> Option<String> {
        self.heads().into_iter().find_map(|head| head.connection_id)
    }
}

async fn forward(state: Arc<State>, mut client: TcpStream) {
    let mut hold = state.hold.subscribe();
    if hold.wait_for(|held| !*held).await.is_err() {
        return;
    }
    let Ok(mut server) = TcpStream::connect(&state.upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let upstream = async {
        let mut buf = vec![0_u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            record_heads(&state, &buf[..n]);
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    };
    let downstream = async {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

/// Notes each request head in `bytes` (a head arrives in one read on
/// loopback; bodies are skipped because they do not start with a verb
/// followed by a path).
fn record_heads(state: &State, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.split("\r\n");
    while let Some(line) = lines.next() {
        let Some((method, rest)) = line.split_once(' ') else {
            continue;
        };
        if !matches!(method, "GET" | "POST" | "DELETE" | "PUT" | "HEAD") || !rest.starts_with('/') {
            continue;
        }
        let mut head = RequestHead {
            method: method.to_owned(),
            connection_id: None,
            last_event_id: None,
        };
        for header in lines.by_ref() {
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let name = name.trim();
                if name.eq_ignore_ascii_case(CONNECTION_ID_HEADER) {
                    head.connection_id = Some(value.trim().to_owned());
                } else if name.eq_ignore_ascii_case("last-event-id") {
                    head.last_event_id = Some(value.trim().to_owned());
                }
            }
        }
        if let Ok(mut heads) = state.heads.lock() {
            heads.push(head);
        }
    }
}

/// Runs once, when [`ResponseCut`] cuts its answer.
type OnCut = Box<dyn FnOnce() + Send>;

/// A loopback TCP proxy that cuts the answer to the first request whose
/// head contains a given text (e.g. `GET /v2/fs/file`) after `limit` bytes
/// (head and body together), runs a callback, then closes that connection:
/// the client sees a transfer broken off midway. Everything else is
/// forwarded whole. Every request head is kept as text.
#[derive(Clone)]
pub struct ResponseCut {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

/// What the connections of one [`ResponseCut`] share.
struct CutPlan {
    upstream: String,
    trigger: String,
    limit: usize,
    /// Taken by the connection that cuts; `None` once the cut happened.
    on_cut: Mutex<Option<OnCut>>,
    heads: Arc<Mutex<Vec<String>>>,
}

impl ResponseCut {
    /// Starts the proxy on `127.0.0.1:0` in front of `upstream`
    /// (`127.0.0.1:PORT`). `on_cut` runs after the `limit` bytes went out
    /// and before the connection closes (a test changes the file there).
    ///
    /// # Panics
    /// If the listener cannot be bound.
    pub async fn start(
        upstream: &str,
        trigger: &str,
        limit: usize,
        on_cut: impl FnOnce() + Send + 'static,
    ) -> ResponseCut {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let heads = Arc::new(Mutex::new(Vec::new()));
        let plan = Arc::new(CutPlan {
            upstream: upstream.to_owned(),
            trigger: trigger.to_owned(),
            limit,
            on_cut: Mutex::new(Some(Box::new(on_cut))),
            heads: Arc::clone(&heads),
        });
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward_or_cut(Arc::clone(&plan), client));
            }
        });
        ResponseCut { addr, heads }
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request head seen so far (request line and header lines, as
    /// sent), in order.
    pub fn heads(&self) -> Vec<String> {
        self.heads
            .lock()
            .map(|heads| heads.clone())
            .unwrap_or_default()
    }
}

async fn forward_or_cut(plan: Arc<CutPlan>, mut client: TcpStream) {
    let Ok(mut server) = TcpStream::connect(&plan.upstream).await else {
        return;
    };
    // Set (with the callback) once this connection carries the request to
    // cut: HTTP/1.1 answers in order, so every byte the server sends after
    // it belongs to that request's answer.
    let armed: Mutex<Option<OnCut>> = Mutex::new(None);
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let upstream = async {
        let mut buf = vec![0_u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let text = String::from_utf8_lossy(&buf[..n]);
            if let Some((head, _)) = text.split_once("\r\n\r\n")
                && head.contains(" HTTP/1.1")
            {
                if let Ok(mut heads) = plan.heads.lock() {
                    heads.push(head.to_owned());
                }
                if head.contains(&plan.trigger)
                    && let Some(on_cut) = plan.on_cut.lock().ok().and_then(|mut c| c.take())
                    && let Ok(mut armed) = armed.lock()
                {
                    *armed = Some(on_cut);
                }
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    };
    // Returns true when it cut the answer.
    let downstream = async {
        let mut buf = vec![0_u8; 64 * 1024];
        let mut sent = 0;
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            };
            let cut = armed.lock().ok().and_then(|mut armed| {
                let room = plan.limit - sent;
                (armed.is_some() && n >= room).then(|| (room, armed.take()))
            });
            if let Some((room, on_cut)) = cut {
                let _ = client_write.write_all(&buf[..room]).await;
                let _ = client_write.flush().await;
                if let Some(on_cut) = on_cut {
                    on_cut();
                }
                return true;
            }
            if armed.lock().is_ok_and(|armed| armed.is_some()) {
                sent += n;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                return false;
            }
        }
    };
    let mut upstream = std::pin::pin!(upstream);
    let mut downstream = std::pin::pin!(downstream);
    tokio::select! {
        () = &mut upstream => {
            downstream.await;
        }
        cut = &mut downstream => {
            if !cut {
                upstream.await;
            }
        }
    }
}
