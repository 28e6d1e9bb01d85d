-- The conversation store (PostgreSQL). Times are unix milliseconds (UTC); message ids are the
-- 32-byte chained sha256 of conversation::identity. Bodies are JSON (not JSONB): PostgreSQL keeps
-- the exact text, key order and all, and unlike JSONB it accepts \u0000 inside strings.

CREATE TABLE sessions (
    tenant        TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    key_hash      TEXT,
    user_id       TEXT,
    created_at    BIGINT  NOT NULL,
    updated_at    BIGINT  NOT NULL,
    head_id       BYTEA,
    lock_owner    TEXT,
    lock_until    BIGINT,
    summary_owner TEXT,
    summary_until BIGINT,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX sessions_by_update ON sessions (updated_at DESC, tenant, id);
CREATE INDEX sessions_by_tenant_update ON sessions (tenant, updated_at DESC, id);

CREATE TABLE messages (
    tenant          TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    id              BYTEA   NOT NULL,
    parent_id       BYTEA,
    seq             BIGINT  NOT NULL,
    origin          TEXT    NOT NULL CHECK (origin IN ('client', 'reply')),
    reply_in_prefix BOOLEAN NOT NULL,
    body            JSON    NOT NULL,
    created_at      BIGINT  NOT NULL,
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
    head_id             BYTEA,
    created_at          BIGINT  NOT NULL,
    endpoint            TEXT    NOT NULL,
    model               TEXT,
    status              BIGINT  NOT NULL,
    tokens_in           BIGINT,
    tokens_out          BIGINT,
    latency_ms          BIGINT,
    upstream_latency_ms BIGINT,
    request_id          TEXT,
    report              JSON,
    choices             JSON,
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
CREATE INDEX requests_by_session ON requests (tenant, session_id, created_at);

CREATE TABLE summaries (
    id           BIGSERIAL PRIMARY KEY,
    tenant       TEXT    NOT NULL,
    session_id   TEXT    NOT NULL,
    anchor_id    BYTEA   NOT NULL,
    covers_until BIGINT  NOT NULL,
    text         TEXT    NOT NULL,
    token_count  BIGINT  NOT NULL,
    model        TEXT,
    created_at   BIGINT  NOT NULL,
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
CREATE INDEX summaries_by_anchor ON summaries (tenant, session_id, anchor_id);

CREATE TABLE responses (
    tenant      TEXT    NOT NULL,
    response_id TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    message_id  BYTEA   NOT NULL,
    created_at  BIGINT  NOT NULL,
    PRIMARY KEY (tenant, response_id),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
CREATE INDEX responses_by_session ON responses (tenant, session_id);
