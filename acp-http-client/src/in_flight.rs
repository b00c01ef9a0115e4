//! The set of our requests still waiting for their response, used to
//! deliver every response exactly once.
//!
//! A response can reach us twice: in a POST's 200 body and on the SSE
//! stream (the server moves a response to the stream when the POST's
//! caller went away or timed out; research/contract.md,
//! "Transport: /v2/rpc"). The first arrival of a response whose id is in
//! flight is delivered and takes the id out; a later one finds nothing and
//! is a duplicate.

use std::collections::HashMap;

/// Raw JSON-RPC id text of each outgoing request → how many requests with
/// that id are waiting.
///
/// A multiset rather than a set because a caller may reuse an id while the
/// first request is still waiting; the server then answers the second one
/// at once with an error (research/contract.md, "Transport: /v2/rpc", edge
/// rules), and both answers must get through.
#[derive(Debug, Default)]
pub struct InFlight {
    waiting: HashMap<String, usize>,
}

impl InFlight {
    /// Records one request with raw id text `id` as waiting.
    pub fn insert(&mut self, id: &str) {
        *self.waiting.entry(id.to_owned()).or_insert(0) += 1;
    }

    /// Takes one waiting request with raw id text `id`. Returns `true` if
    /// there was one (deliver the response), `false` if not (a duplicate,
    /// or a response to nothing we sent).
    pub fn take(&mut self, id: &str) -> bool {
        let Some(count) = self.waiting.get_mut(id) else {
            return false;
        };
        *count -= 1;
        if *count == 0 {
            self.waiting.remove(id);
        }
        true
    }

    /// Whether a request with raw id text `id` is waiting.
    #[cfg(test)]
    pub fn contains(&self, id: &str) -> bool {
        self.waiting.contains_key(id)
    }

    /// Number of distinct ids waiting.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_arrival_wins_and_the_second_is_a_duplicate() {
        let mut set = InFlight::default();
        set.insert("1");
        set.insert(r#""a""#);
        assert!(set.take("1"));
        assert!(!set.take("1"), "second arrival of the same response");
        assert!(set.contains(r#""a""#));
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn ids_are_compared_as_raw_text() {
        let mut set = InFlight::default();
        set.insert("1");
        assert!(!set.take(r#""1""#), "the string \"1\" is not the number 1");
        assert!(set.take("1"));
    }

    #[test]
    fn unknown_ids_are_not_delivered() {
        let mut set = InFlight::default();
        assert!(!set.take("7"));
        assert_eq!(set.len(), 0);
    }

    #[test]
    fn a_reused_id_gets_both_answers_then_no_more() {
        let mut set = InFlight::default();
        set.insert("5");
        set.insert("5");
        assert!(set.take("5"));
        assert!(set.take("5"));
        assert!(!set.take("5"));
        assert_eq!(set.len(), 0);
    }
}
