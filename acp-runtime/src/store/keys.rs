//! The integer keys of sessions' event rows (schema version 4,
//! `session_keys`), as the writer task knows them: a session seen before
//! costs no statement, a new one a lookup and at most one insert.
//!
//! A key made inside a transaction exists only once that transaction
//! commits, so it is held apart ([`SessionKeys::fresh`]) until then: a
//! rolled back batch must not leave the writer with a key the database
//! does not have (its events would be written under a key no read finds).

use super::rows::Key;
use std::collections::HashMap;

/// Most keys kept; past it the committed ones are forgotten at once (a
/// forgotten key costs one lookup when its session writes again).
const MAX_KEPT: usize = 10_000;

/// The keys the writer has read or made, by (agent, session id) of its
/// runtime id. Owned by the writer task, the only writer of `session_keys`.
#[derive(Debug, Default)]
pub(crate) struct SessionKeys {
    /// Keys the database has committed.
    known: HashMap<Key, i64>,
    /// Keys read or made in the transaction being written.
    fresh: HashMap<Key, i64>,
}

impl SessionKeys {
    /// The key of `session`, if known here (committed or in this
    /// transaction).
    pub(crate) fn get(&self, session: &Key) -> Option<i64> {
        self.fresh
            .get(session)
            .or_else(|| self.known.get(session))
            .copied()
    }

    /// Notes `key` of `session`, read or made in the transaction being
    /// written.
    pub(crate) fn add(&mut self, session: Key, key: i64) {
        self.fresh.insert(session, key);
    }

    /// Forgets `session`'s key (its key row is being deleted).
    pub(crate) fn forget(&mut self, session: &Key) {
        self.fresh.remove(session);
        self.known.remove(session);
    }

    /// A transaction begins: keys of one that did not commit are dropped.
    pub(crate) fn begin(&mut self) {
        self.fresh.clear();
    }

    /// The transaction committed: its keys are known from now on.
    pub(crate) fn committed(&mut self) {
        if self.known.len() + self.fresh.len() > MAX_KEPT {
            self.known.clear();
        }
        self.known.extend(self.fresh.drain());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn session(id: &str) -> Key {
        (Arc::from("mock"), Arc::from(id))
    }

    #[test]
    fn a_key_is_known_after_its_commit_only() {
        let mut keys = SessionKeys::default();
        keys.begin();
        keys.add(session("a"), 1);
        assert_eq!(keys.get(&session("a")), Some(1), "within its transaction");
        keys.begin();
        assert_eq!(keys.get(&session("a")), None, "rolled back: gone");
        keys.add(session("a"), 2);
        keys.committed();
        keys.begin();
        assert_eq!(keys.get(&session("a")), Some(2));
        keys.forget(&session("a"));
        assert_eq!(keys.get(&session("a")), None);
    }

    #[test]
    fn keys_kept_are_bounded() {
        let mut keys = SessionKeys::default();
        for n in 0..=MAX_KEPT {
            keys.add(session(&n.to_string()), n as i64);
        }
        keys.committed();
        keys.add(session("last"), -1);
        keys.committed();
        assert!(keys.known.len() <= MAX_KEPT + 1);
        assert_eq!(keys.get(&session("last")), Some(-1));
    }
}
