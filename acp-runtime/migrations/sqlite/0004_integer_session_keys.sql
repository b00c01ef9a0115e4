-- Schema version 4: an event row is keyed by an integer per session
-- (session_keys) and its offset, not by the runtime id, agent and session
-- id as text: a row is about a third smaller, and so is the writer's work
-- per event (research/decisions.md, "Events keyed by an integer").
-- AUTOINCREMENT: a key is never handed out twice, even after the session
-- with the largest one is deleted.
CREATE TABLE session_keys (
    session_key INTEGER PRIMARY KEY AUTOINCREMENT,
    runtime_id  TEXT    NOT NULL,
    agent       TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    UNIQUE (runtime_id, agent, session_id)
);
-- Every session with an entry or an event keeps what it had.
INSERT INTO session_keys (runtime_id, agent, session_id)
    SELECT runtime_id, agent, session_id FROM sessions
    UNION
    SELECT runtime_id, agent, session_id FROM events
    ORDER BY 1, 2, 3;
ALTER TABLE events RENAME TO events_v3;
CREATE TABLE events (
    session_key  INTEGER NOT NULL,
    event_offset INTEGER NOT NULL,
    at_ns        INTEGER NOT NULL,
    direction    TEXT    NOT NULL,
    message      BLOB    NOT NULL,
    PRIMARY KEY (session_key, event_offset)
) WITHOUT ROWID; -- one b-tree, clustered by the key: a page read is one range scan
INSERT INTO events (session_key, event_offset, at_ns, direction, message)
    SELECT k.session_key, e.event_offset, e.at_ns, e.direction, e.message
    FROM events_v3 e
    JOIN session_keys k
      ON k.runtime_id = e.runtime_id AND k.agent = e.agent AND k.session_id = e.session_id
    ORDER BY k.session_key, e.event_offset;
DROP TABLE events_v3;
