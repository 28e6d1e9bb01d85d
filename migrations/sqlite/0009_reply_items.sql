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
    message_id  BLOB    NOT NULL,
    PRIMARY KEY (tenant, item_id, key_hash),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
CREATE INDEX reply_items_by_session ON reply_items (tenant, session_id);
