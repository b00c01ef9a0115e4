//! Wire constants and JSON-RPC envelope handling. No I/O.
//!
//! The runtime parses each JSON-RPC object once into an [`Envelope`] that
//! borrows from the received bytes: `id`, `params`, `result` and `error` stay
//! raw JSON (`serde_json::value::RawValue`) and are copied through verbatim,
//! so ids round-trip exactly (same JSON type, same digits, same string bytes)
//! and params are never re-serialized. Only the `id` of a request is rewritten
//! on its way to an agent
//! (research/contract.md, "Routing: connections, sessions, one agent process").
//!
//! # Layout
//! - `names`: header names, media types, method names, update kinds, error codes.
//! - `envelope`: a client's JSON-RPC message, parsed once.
//! - `error`: why bytes are not a message the runtime takes.
//! - `decodable`: the scan that refuses undecodable JSON and members named twice.
//! - `agent_line`: an agent's line, read leniently in one pass.
//! - `lines`: JSON-RPC lines built for agents and clients.
//! - `method`: ACP method names and [`Method`], a message's method classified once.
//! - `meta`: the runtime's `_meta` namespace.

mod agent_line;
mod decodable;
mod envelope;
mod error;
mod lines;
mod meta;
pub mod method;
mod names;
#[cfg(test)]
mod tests;

pub use self::agent_line::*;
pub use self::decodable::*;
pub use self::envelope::*;
pub use self::error::*;
pub use self::lines::*;
pub use self::meta::*;
pub use self::method::{Lane, Method, Scope};
pub use self::names::*;
