//! What a running server holds about its clients and sessions, shared by
//! the request handlers and the agents' stdout loops (research/contract.md,
//! "Routing: connections, sessions, one agent process").
//!
//! - `connection`: one client connection: its replay ring of
//!   `(sequence, lane, JSON)`, its live stream slots, in-flight ids.
//! - `connections`: the open connections, the connection cap, idle reaping.
//! - `session`: one session: attachments and their roles, metadata, hints,
//!   its event log, the store rows.
//! - `sessions`: the server-wide inventory of them: by id, the listing
//!   order and cursors, the cache of sessions recalled from the store.
//! - `event_log`: each session's recorded ACP traffic.
//! - `history`: a session's history for an attaching connection, made from
//!   its event log.
//! - `hints`: title / model / mode read from ACP messages.

pub mod connection;
pub mod connections;
pub mod event_log;
pub mod hints;
pub mod history;
pub mod session;
pub mod sessions;
