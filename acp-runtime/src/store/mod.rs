//! Durable sessions: the session inventory and every session's event log in
//! SQLite (the default, `<data-dir>/sessions.db`) or PostgreSQL, behind one
//! small interface (research/contract.md, "Durable sessions").
//!
//! Memory stays the serving layer: the runtime answers from its own
//! inventory and logs, and `writer` copies every change to the store off
//! the request path. The store is read at start-up (the inventory of this
//! runtime id) and when a client pages events older than what memory holds.
//!
//! Entries are keyed by (runtime id, agent, session id); events by an
//! integer per session (`session_keys`, which maps the two) and their
//! offset (SQLite: both in one integer, the rowid; see [`event_id`]). Both
//! backends go
//! through one `sqlx` `Any` pool; the SQL is written once with `$N`
//! placeholders and rewritten to SQLite's `?N` form.
//!
//! # Layout
//! - this file: the modules and what they show the rest of the crate.
//! - `handle`: [`Store`] (the handle, its small accessors, close) and the
//!   encodings every part shares (times, cursors, event ids).
//! - `url`: `--store` URLs parsed, passwords redacted; `runtime_id`: the
//!   runtime id's rules and the default one in the data dir;
//!   `migrations`: the embedded schema.
//! - `open`: the file lock, the probe, the pool, the migrations; `read`:
//!   pages, counts, events, each read bounded in time; `write`: one
//!   batch in one transaction; `writer`: the task that makes the batches
//!   off the request path, with `share` (each agent's part of its queue)
//!   and `writer_priority` (SQLite's own writer connection, lowered).
//! - `interrupted`: turns a stopped server left open, recorded at start;
//!   `file`: the SQLite file checked while the server runs; `runtime_lock`:
//!   one server per runtime id; `tls`: PostgreSQL's TLS settings; `rows`
//!   and `keys`: what a write and a session key are.

mod file;
mod handle;
mod interrupted;
mod keys;
mod migrations;
mod open;
mod read;
mod rows;
mod runtime_id;
pub(crate) mod runtime_lock;
pub(crate) mod share;
mod tls;
mod url;
mod write;
pub(crate) mod writer;
mod writer_priority;

pub(crate) use handle::{Backend, event_id};
pub use handle::{
    DEFAULT_SQLITE_FILE, RUNTIME_ID_FILE, Store, cursor, nanos, parse_cursor, time_of,
};
pub use migrations::migrations;
pub(crate) use read::{Bounded, event_row};
pub use rows::{EventRow, PageQuery, SessionRow, StoreError};
pub use runtime_id::{check_runtime_id, default_runtime_id};
pub use url::StoreUrl;
pub(crate) use write::direction_text;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls() {
        assert_eq!(StoreUrl::parse("memory"), Ok(StoreUrl::Memory));
        assert_eq!(
            StoreUrl::parse("sqlite:/d/s.db"),
            Ok(StoreUrl::Sqlite("/d/s.db".into()))
        );
        assert_eq!(
            StoreUrl::parse("sqlite:///d/s.db"),
            Ok(StoreUrl::Sqlite("/d/s.db".into()))
        );
        assert!(StoreUrl::parse("sqlite:").is_err());
        assert!(StoreUrl::parse("mysql://x").is_err());
        let url = StoreUrl::parse("postgres://u:secret@h:5432/db").expect("postgres");
        assert_eq!(url.redacted(), "postgres://u:***@h:5432/db");
        assert_eq!(
            StoreUrl::parse("postgresql://u@h/db")
                .expect("postgresql")
                .redacted(),
            "postgresql://u@h/db"
        );
        let url =
            StoreUrl::parse("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&password=p")
                .expect("postgres");
        assert_eq!(
            url.redacted(),
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Fca.pem&password=***"
        );
        let url = StoreUrl::parse("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem")
            .expect("postgres");
        assert_eq!(
            url.redacted(),
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem"
        );
    }

    #[test]
    fn sqlite_event_ids_hold_a_key_below_2_31_and_an_offset_below_2_32() {
        assert_eq!(event_id(0, 0), Some(0));
        assert_eq!(event_id(1, 0), Some(1 << 32));
        assert_eq!(event_id(3, 7), Some(3 * (1 << 32) + 7));
        let last_offset = (1_u64 << 32) - 1;
        assert_eq!(
            event_id(1, last_offset),
            Some((1 << 32) + i64::try_from(last_offset).expect("small"))
        );
        // Offsets of one key never reach the next key's ids.
        assert!(event_id(1, last_offset) < event_id(2, 0));
        assert_eq!(event_id(1, 1 << 32), None);
        assert_eq!(event_id(1, u64::MAX), None);
        let last_key = (1_i64 << 31) - 1;
        assert_eq!(event_id(last_key, last_offset), Some(i64::MAX));
        assert_eq!(event_id(1 << 31, 0), None);
        assert_eq!(event_id(-1, 0), None);
    }
}
