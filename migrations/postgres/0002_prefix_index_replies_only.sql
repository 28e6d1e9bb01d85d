-- Auto matching only counts messages with a stored reply in their prefix. Conversations of one
-- agent share their first messages (system prompt, first question: same chained ids), so the
-- full (tenant, id) index made every lookup visit one row per session ever started with that
-- prefix: O(sessions) per request. Indexing only the rows the lookup can match keeps it O(1).
DROP INDEX IF EXISTS messages_by_id;
CREATE INDEX messages_by_id_with_reply ON messages (tenant, id) WHERE reply_in_prefix;
