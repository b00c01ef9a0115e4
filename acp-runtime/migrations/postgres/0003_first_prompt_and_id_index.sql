-- Schema version 3: an entry keeps its first prompt's text (what a list
-- shows for a session without a title), and a session is found by its id
-- alone through an index (entries of ended and dormant sessions are read
-- from the store when asked for, not kept in memory).
ALTER TABLE sessions ADD COLUMN first_prompt TEXT;
CREATE INDEX sessions_by_id ON sessions (runtime_id, session_id);
