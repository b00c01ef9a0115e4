-- Schema version 1: the session inventory and each session's event log,
-- keyed by (runtime id, agent, session id) (research/contract.md,
-- "Durable sessions"). Times are nanoseconds since the Unix epoch (UTC).
CREATE TABLE sessions (
    runtime_id  TEXT    NOT NULL,
    agent       TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    cwd         TEXT,
    created_ns  BIGINT  NOT NULL,
    updated_ns  BIGINT  NOT NULL,
    end_reason  TEXT,
    metadata    TEXT    NOT NULL DEFAULT '{}',
    event_count BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (runtime_id, agent, session_id)
);

CREATE TABLE events (
    runtime_id   TEXT    NOT NULL,
    agent        TEXT    NOT NULL,
    session_id   TEXT    NOT NULL,
    event_offset BIGINT  NOT NULL,
    at_ns        BIGINT  NOT NULL,
    direction    TEXT    NOT NULL,
    message      BYTEA   NOT NULL,
    PRIMARY KEY (runtime_id, agent, session_id, event_offset)
);
