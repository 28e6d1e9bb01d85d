-- Responses API reply items by their own id (`msg_…`, `fc_…`, `rs_…`): a client that sends an
-- earlier reply back as an `item_reference` (the Vercel AI SDK with `store`, its default) is
-- sent, stored and counted as the item the proxy stored, so its conversation still matches
-- what is stored and its budget counts what the upstream reads. Per client key, as response
-- ids are (hex sha256; empty: no key).
CREATE TABLE reply_items (
    tenant      TEXT    NOT NULL,
    item_id     TEXT    NOT NULL,
    key_hash    TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    message_id  BYTEA   NOT NULL,
    PRIMARY KEY (tenant, item_id, key_hash),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
CREATE INDEX reply_items_by_session ON reply_items (tenant, session_id);
-- The reply items stored before this table: found as those stored after it are (the session's
-- key stands for the key of each of its replies, as auto matching scopes it).
INSERT INTO reply_items (tenant, item_id, key_hash, session_id, message_id)
SELECT m.tenant, m.body->>'id', COALESCE(s.key_hash, ''), m.session_id, m.id
FROM messages m JOIN sessions s ON s.tenant = m.tenant AND s.id = m.session_id
WHERE m.origin = 'reply'
  AND json_typeof(m.body->'id') = 'string'
  AND json_typeof(m.body->'type') = 'string'
ON CONFLICT DO NOTHING;
