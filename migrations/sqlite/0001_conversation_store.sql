-- The conversation store (SQLite). Times are unix milliseconds (UTC); message ids are the
-- 32-byte chained sha256 of conversation::identity; bodies are the JSON text as received.

CREATE TABLE sessions (
    tenant        TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    key_hash      TEXT,
    user_id       TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    head_id       BLOB,
    lock_owner    TEXT,
    lock_until    INTEGER,
    summary_owner TEXT,
    summary_until INTEGER,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX sessions_by_update ON sessions (updated_at DESC, tenant, id);
CREATE INDEX sessions_by_tenant_update ON sessions (tenant, updated_at DESC, id);

CREATE TABLE messages (
    tenant          TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    id              BLOB    NOT NULL,
    parent_id       BLOB,
    seq             INTEGER NOT NULL,
    origin          TEXT    NOT NULL CHECK (origin IN ('client', 'reply')),
    reply_in_prefix INTEGER NOT NULL,
    body            TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (tenant, session_id, id),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
-- auto matching looks a chain of ids up across all sessions of a tenant
CREATE INDEX messages_by_id ON messages (tenant, id);
-- leaves (branches) are messages without children
CREATE INDEX messages_by_parent ON messages (tenant, session_id, parent_id);

CREATE TABLE requests (
    id                  TEXT    NOT NULL PRIMARY KEY,
    tenant              TEXT    NOT NULL,
    session_id          TEXT    NOT NULL,
    head_id             BLOB,
    created_at          INTEGER NOT NULL,
    endpoint            TEXT    NOT NULL,
    model               TEXT,
    status              INTEGER NOT NULL,
    tokens_in           INTEGER,
    tokens_out          INTEGER,
    latency_ms          INTEGER,
    upstream_latency_ms INTEGER,
    request_id          TEXT,
    report              TEXT,
    choices             TEXT,
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
CREATE INDEX requests_by_session ON requests (tenant, session_id, created_at);

CREATE TABLE summaries (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant       TEXT    NOT NULL,
    session_id   TEXT    NOT NULL,
    anchor_id    BLOB    NOT NULL,
    covers_until INTEGER NOT NULL,
    text         TEXT    NOT NULL,
    token_count  INTEGER NOT NULL,
    model        TEXT,
    created_at   INTEGER NOT NULL,
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
CREATE INDEX summaries_by_anchor ON summaries (tenant, session_id, anchor_id);

CREATE TABLE responses (
    tenant      TEXT    NOT NULL,
    response_id TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    message_id  BLOB    NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant, response_id),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
CREATE INDEX responses_by_session ON responses (tenant, session_id);
