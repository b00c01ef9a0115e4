-- Schema version 1: the session inventory and each session's event log,
-- keyed by (runtime id, agent, session id) (research/contract.md,
-- "Durable sessions"). Times are nanoseconds since the Unix epoch (UTC).
CREATE TABLE sessions (
    runtime_id  TEXT    NOT NULL,
    agent       TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    cwd         TEXT,
    created_ns  INTEGER NOT NULL,
    updated_ns  INTEGER NOT NULL,
    end_reason  TEXT,
    metadata    TEXT    NOT NULL DEFAULT '{}',
    event_count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (runtime_id, agent, session_id)
);

CREATE TABLE events (
    runtime_id   TEXT    NOT NULL,
    agent        TEXT    NOT NULL,
    session_id   TEXT    NOT NULL,
    event_offset INTEGER NOT NULL,
    at_ns        INTEGER NOT NULL,
    direction    TEXT    NOT NULL,
    message      BLOB    NOT NULL,
    PRIMARY KEY (runtime_id, agent, session_id, event_offset)
) WITHOUT ROWID; -- one b-tree, clustered by the key: a page read is one range scan
