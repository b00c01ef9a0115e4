-- Schema version 2: the hints a session's entry shows (title, model, mode,
-- the models the agent offers as JSON) became columns, and listing newest
-- first reads an index instead of sorting the table.
ALTER TABLE sessions ADD COLUMN title TEXT;
ALTER TABLE sessions ADD COLUMN model TEXT;
ALTER TABLE sessions ADD COLUMN mode TEXT;
ALTER TABLE sessions ADD COLUMN models TEXT;
CREATE INDEX sessions_newest_first ON sessions (runtime_id, created_ns DESC, agent DESC, session_id DESC);
-- Version 1 kept the hints inside the metadata object: move them out.
UPDATE sessions SET
    title = metadata::jsonb ->> 'title',
    model = metadata::jsonb ->> 'model',
    mode = metadata::jsonb ->> 'mode';
