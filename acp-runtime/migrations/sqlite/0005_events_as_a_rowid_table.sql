-- Schema version 5 (SQLite): events in a rowid table whose rowid, event_id,
-- is session_key * 2^32 + event_offset. A burst appends at the table's
-- right edge, where SQLite splits a full page cheaply; the WITHOUT ROWID
-- table of version 4 rebalanced its neighbours at every split, a cost that
-- grows with the row (research/decisions.md, "The writer's cost per event").
-- The key and the offset stay readable as virtual (not stored) columns.
-- An event_id holds offsets below 2^32 and session keys below 2^31; the
-- writer does not store an event past them.
ALTER TABLE events RENAME TO events_v4;
CREATE TABLE events (
    event_id     INTEGER PRIMARY KEY,
    at_ns        INTEGER NOT NULL,
    direction    TEXT    NOT NULL,
    message      BLOB    NOT NULL,
    session_key  INTEGER GENERATED ALWAYS AS (event_id >> 32) VIRTUAL,
    event_offset INTEGER GENERATED ALWAYS AS (event_id & 4294967295) VIRTUAL
);
-- Every event of version 4 is copied. One past the limits could not be
-- kept and is left out; none is in practice (its session would have had
-- 4,294,967,296 events, or its store 2^31 sessions).
INSERT INTO events (event_id, at_ns, direction, message)
    SELECT session_key * 4294967296 + event_offset, at_ns, direction, message
    FROM events_v4
    WHERE session_key BETWEEN 0 AND 2147483647 AND event_offset BETWEEN 0 AND 4294967295
    ORDER BY session_key, event_offset;
DROP TABLE events_v4;
