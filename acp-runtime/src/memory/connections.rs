//! The open connections of this server, with the connection cap and idle
//! reaping that keep one client from exhausting the rest, and a bounded
//! memory of the ids reaped for idleness so a late client learns why its id
//! is gone.

use crate::budget::MemoryBudget;
use crate::error::Error;
use crate::memory::connection::{ClientCapabilities, Connection, Profile, ReplayLimits};
use crate::memory::sessions::Sessions;
use crate::metrics::{Metrics, Transport};
use dashmap::DashMap;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How many reaped connection ids are remembered (the most recent ones),
/// about 100 bytes each.
const REAPED_MEMORY: usize = 4096;

/// A fresh random connection id (a UUID v4).
pub fn new_id() -> Arc<str> {
    uuid::Uuid::new_v4().to_string().into()
}

/// Open connections by id.
#[derive(Debug)]
pub struct Connections {
    map: DashMap<Arc<str>, Arc<Connection>>,
    /// Ids closed for idleness, so their 404 can say so.
    reaped: Mutex<Reaped>,
    /// Open connections; checked against `max` before a new one is made.
    count: AtomicUsize,
    max: usize,
    limits: ReplayLimits,
    epoch: Instant,
    /// The account every connection's ring is charged to (`None`: uncounted).
    budget: Option<Arc<MemoryBudget>>,
    /// Where every connection is counted (`None`: uncounted).
    metrics: Option<Arc<Metrics>>,
}

impl Connections {
    /// An empty registry allowing `max` open connections.
    pub fn new(max: usize, limits: ReplayLimits) -> Self {
        Self {
            map: DashMap::new(),
            reaped: Mutex::new(Reaped::default()),
            count: AtomicUsize::new(0),
            max,
            limits,
            epoch: Instant::now(),
            budget: None,
            metrics: None,
        }
    }

    /// Charges every connection opened from now on to `budget`
    /// (research/contract.md, "Memory budget").
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Counts every connection opened from now on, its replays and its
    /// stream gaps (research/contract.md, "Metrics").
    pub(crate) fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Opens a connection bound to `agent`, with a fresh random id.
    ///
    /// # Errors
    /// [`Error::TooManyConnections`] at the cap.
    pub fn open(
        &self,
        agent: Arc<str>,
        capabilities: ClientCapabilities,
        profile: Profile,
    ) -> Result<Arc<Connection>, Error> {
        let transport = match profile {
            Profile::V2Rpc => Transport::V2Sse,
            Profile::Acp => Transport::AcpHttp,
        };
        self.open_on(new_id(), agent, capabilities, profile, transport)
    }

    /// [`Connections::open`] under an id made earlier with [`new_id`] (a
    /// WebSocket announces it in its 101 before `initialize` arrives).
    ///
    /// # Errors
    /// [`Error::TooManyConnections`] at the cap; [`Error::InvalidRequest`]
    /// when a connection with this id is open already.
    pub fn open_as(
        &self,
        id: Arc<str>,
        agent: Arc<str>,
        capabilities: ClientCapabilities,
        profile: Profile,
    ) -> Result<Arc<Connection>, Error> {
        self.open_on(id, agent, capabilities, profile, Transport::AcpWs)
    }

    /// Opens connection `id`, counted as open on `transport`.
    fn open_on(
        &self,
        id: Arc<str>,
        agent: Arc<str>,
        capabilities: ClientCapabilities,
        profile: Profile,
        transport: Transport,
    ) -> Result<Arc<Connection>, Error> {
        if self.map.contains_key(&id) {
            return Err(Error::InvalidRequest(format!(
                "connection {id} is initialized already"
            )));
        }
        let reserved = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            });
        if reserved.is_err() {
            return Err(Error::TooManyConnections { limit: self.max });
        }
        let mut connection = Connection::new(
            id.clone(),
            agent,
            capabilities,
            profile,
            self.limits,
            self.epoch,
        );
        if let Some(budget) = &self.budget {
            connection = connection.with_budget(budget.clone());
        }
        if let Some(metrics) = &self.metrics {
            connection = connection.with_metrics(metrics.clone(), transport);
        }
        let connection = Arc::new(connection);
        self.map.insert(id, connection.clone());
        Ok(connection)
    }

    /// Whether another connection may be opened now.
    pub fn has_room(&self) -> bool {
        self.count.load(Ordering::Acquire) < self.max
    }

    /// The open connection with this id.
    pub fn get(&self, id: &str) -> Option<Arc<Connection>> {
        self.map.get(id).map(|entry| entry.value().clone())
    }

    /// The open connection with this id, for a request that names it.
    ///
    /// # Errors
    /// [`Error::ExpiredConnection`] when idle reaping closed it (among the
    /// last [`REAPED_MEMORY`] reaped), else [`Error::UnknownConnection`];
    /// both are 404 `unknown-connection`.
    pub fn lookup(&self, id: &str) -> Result<Arc<Connection>, Error> {
        if let Some(connection) = self.get(id) {
            return Ok(connection);
        }
        Err(match self.reaped.lock().idle.get(id) {
            Some(&idle) => Error::ExpiredConnection {
                id: id.to_owned(),
                idle,
            },
            None => Error::UnknownConnection(id.to_owned()),
        })
    }

    /// Closes a connection: removes it, ends its stream, fails its waiting
    /// POSTs (they watch [`Connection::closed`]) and detaches it from its
    /// sessions, which live on. Returns whether it was open.
    pub fn close(&self, id: &str, sessions: &Sessions) -> bool {
        let Some((_, connection)) = self.map.remove(id) else {
            return false;
        };
        self.count.fetch_sub(1, Ordering::AcqRel);
        connection.close();
        for session_id in connection.attached_sessions() {
            if let Some(session) = sessions.get(&connection.agent, &session_id) {
                session.detach(&connection);
            }
        }
        true
    }

    /// Open connections bound to `agent`.
    pub fn of_agent(&self, agent: &str) -> Vec<Arc<Connection>> {
        self.map
            .iter()
            .filter(|entry| &*entry.value().agent == agent)
            .map(|entry| entry.value().clone())
            .collect()
    }

    /// Every open connection.
    pub fn all(&self) -> Vec<Arc<Connection>> {
        self.map.iter().map(|entry| entry.value().clone()).collect()
    }

    /// Closes connections with no live stream and no request in progress
    /// whose last activity is older than `idle`. Returns how many.
    pub fn reap_idle(&self, idle: Duration, sessions: &Sessions) -> usize {
        let idle_ms = idle.as_millis() as u64;
        let stale: Vec<Arc<str>> = self
            .map
            .iter()
            .filter(|entry| {
                let c = entry.value();
                !c.has_stream() && !c.has_active_requests() && c.idle_ms() >= idle_ms
            })
            .map(|entry| entry.key().clone())
            .collect();
        stale
            .iter()
            .filter(|id| {
                tracing::info!(connection = %id, "closing idle connection");
                let closed = self.close(id, sessions);
                if closed {
                    self.reaped.lock().remember(Arc::clone(id), idle);
                }
                closed
            })
            .count()
    }
}

/// The most recent [`REAPED_MEMORY`] ids closed for idleness, with the idle
/// timeout that closed them; the oldest is forgotten first.
#[derive(Debug, Default)]
struct Reaped {
    idle: HashMap<Arc<str>, Duration>,
    order: VecDeque<Arc<str>>,
}

impl Reaped {
    fn remember(&mut self, id: Arc<str>, idle: Duration) {
        if self.idle.insert(id.clone(), idle).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > REAPED_MEMORY {
            if let Some(oldest) = self.order.pop_front() {
                self.idle.remove(&oldest);
            }
        }
    }
}
