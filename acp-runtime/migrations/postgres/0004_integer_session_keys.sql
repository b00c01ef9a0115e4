-- Schema version 4: an event row is keyed by an integer per session
-- (session_keys) and its offset, not by the runtime id, agent and session
-- id as text: a row is about a third smaller, and so is the writer's work
-- per event (research/decisions.md, "Events keyed by an integer").
-- An identity column never hands out a key twice.
CREATE TABLE session_keys (
    session_key BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
ALTER TABLE events_v3 RENAME CONSTRAINT events_pkey TO events_v3_pkey;
CREATE TABLE events (
    session_key  BIGINT  NOT NULL,
    event_offset BIGINT  NOT NULL,
    at_ns        BIGINT  NOT NULL,
    direction    TEXT    NOT NULL,
    message      BYTEA   NOT NULL,
    PRIMARY KEY (session_key, event_offset)
);
INSERT INTO events (session_key, event_offset, at_ns, direction, message)
    SELECT k.session_key, e.event_offset, e.at_ns, e.direction, e.message
    FROM events_v3 e
    JOIN session_keys k
      ON k.runtime_id = e.runtime_id AND k.agent = e.agent AND k.session_id = e.session_id
    ORDER BY k.session_key, e.event_offset;
DROP TABLE events_v3;
