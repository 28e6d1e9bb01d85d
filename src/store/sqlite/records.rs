//! SQLite: request records, summaries and the admin session list. Plain functions on a
//! connection; inserts run inside the writer's transaction, the rest on a reader.

use rusqlite::types::ToSql;
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use super::super::cursor::{SESSION_LOOKUP_LIMIT, session_position};
use super::super::time::Timestamp;
use super::super::types::*;
use super::super::{After, Keyset, clamp_limit, encode_cursor};
use super::{SESSION_COLUMNS, session_from_row};
use crate::conversation::MessageId;
use crate::{Error, Result};

fn json_text(v: &Option<Value>) -> Result<Option<String>> {
    v.as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| Error::Internal(format!("record JSON: {e}")))
}

fn json_value(s: Option<String>) -> Result<Option<Value>> {
    s.map(|s| serde_json::from_str(&s))
        .transpose()
        .map_err(|e| Error::Internal(format!("stored record JSON: {e}")))
}

pub(super) fn insert_request(conn: &Connection, r: &NewRequestRecord) -> Result<RequestRecord> {
    let (id, time) = insert_request_row(conn, r, r.head)?;
    Ok(r.stored(id, time))
}

/// Inserts a request record with `head` for its head (a turn's close knows it only once the
/// reply is stored), returning the record's id and time.
pub(super) fn insert_request_row(
    conn: &Connection,
    r: &NewRequestRecord,
    head: Option<MessageId>,
) -> Result<(String, Timestamp)> {
    let id = uuid::Uuid::now_v7().to_string();
    let time = r.arrived.unwrap_or_else(Timestamp::now);
    conn.prepare_cached(
        "INSERT INTO requests (id, tenant, session_id, head_id, created_at, endpoint, model, \
         status, tokens_in, tokens_out, latency_ms, upstream_latency_ms, request_id, report, \
         choices, usage, system) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )?
    .execute(params![
        id,
        r.tenant,
        r.session,
        head.map(|h| h.0),
        time.millis(),
        r.endpoint,
        r.model,
        i64::from(r.status),
        r.tokens_in,
        r.tokens_out,
        r.latency_ms,
        r.upstream_latency_ms,
        r.request_id,
        json_text(&r.report)?,
        json_text(&r.choices)?,
        json_text(&r.usage)?,
        json_text(&r.system)?,
    ])?;
    Ok((id, time))
}

/// Records (or re-points) a Responses API id.
pub(super) fn record_response(
    conn: &Connection,
    tenant: &str,
    response_id: &str,
    session: &str,
    message: MessageId,
    upstream_root: Option<&str>,
    key_hash: Option<&str>,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO responses \
         (tenant, response_id, session_id, message_id, created_at, upstream_root, key_hash) \
         VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, response_id) DO UPDATE SET \
         session_id = excluded.session_id, message_id = excluded.message_id, \
         created_at = excluded.created_at, upstream_root = excluded.upstream_root, \
         key_hash = excluded.key_hash",
    )?
    .execute(params![
        tenant,
        response_id,
        session,
        message.0,
        Timestamp::now().millis(),
        upstream_root,
        key_hash
    ])?;
    Ok(())
}

/// Records the reply items of `messages` that have an id of their own (Responses output
/// items), for `item_reference`s to them (see `Store::find_reply_items`).
pub(super) fn record_reply_items(
    conn: &Connection,
    tenant: &str,
    session: &str,
    key_hash: Option<&str>,
    messages: &[crate::store::NewMessage],
) -> Result<()> {
    for (item_id, message) in crate::store::reply_item_ids(messages) {
        conn.prepare_cached(
            "INSERT INTO reply_items (tenant, item_id, key_hash, session_id, message_id) \
             VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, item_id, key_hash) DO UPDATE SET \
             session_id = excluded.session_id, message_id = excluded.message_id",
        )?
        .execute(params![
            tenant,
            item_id,
            key_hash.unwrap_or_default(),
            session,
            message.0
        ])?;
    }
    Ok(())
}

/// The stored bodies of the reply items `item_ids` names, for `key_hash`.
pub(super) fn find_reply_items(
    conn: &Connection,
    tenant: &str,
    key_hash: Option<&str>,
    item_ids: &[String],
) -> Result<Vec<(String, Value)>> {
    let mut found = Vec::new();
    let mut statement = conn.prepare_cached(
        "SELECT m.body FROM reply_items r JOIN messages m \
         ON m.tenant = r.tenant AND m.session_id = r.session_id AND m.id = r.message_id \
         WHERE r.tenant = ? AND r.item_id = ? AND r.key_hash = ?",
    )?;
    for item_id in item_ids {
        let body: Option<String> = statement
            .query_row(
                params![tenant, item_id, key_hash.unwrap_or_default()],
                |row| row.get(0),
            )
            .optional()?;
        if let Some(body) = body {
            let body = serde_json::from_str(&body)
                .map_err(|e| Error::Internal(format!("stored message JSON: {e}")))?;
            found.push((item_id.clone(), body));
        }
    }
    Ok(found)
}

pub(super) fn list_requests(
    conn: &Connection,
    tenant: &str,
    session: &str,
) -> Result<Vec<RequestRecord>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, tenant, session_id, head_id, created_at, endpoint, model, status, tokens_in, \
         tokens_out, latency_ms, upstream_latency_ms, request_id, report, choices, usage, \
         system FROM requests WHERE tenant = ? AND session_id = ? ORDER BY created_at, id",
    )?;
    let mut rows = stmt.query(params![tenant, session])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(request_from_row(row)?);
    }
    Ok(out)
}

fn request_from_row(row: &Row<'_>) -> Result<RequestRecord> {
    let head: Option<Vec<u8>> = row.get("head_id")?;
    let status: i64 = row.get("status")?;
    Ok(RequestRecord {
        id: row.get("id")?,
        tenant: row.get("tenant")?,
        session: row.get("session_id")?,
        head: head.as_deref().map(id_from_bytes).transpose()?,
        time: Timestamp(row.get("created_at")?),
        endpoint: row.get("endpoint")?,
        model: row.get("model")?,
        status: u16::try_from(status).unwrap_or(0),
        tokens_in: row.get("tokens_in")?,
        tokens_out: row.get("tokens_out")?,
        latency_ms: row.get("latency_ms")?,
        upstream_latency_ms: row.get("upstream_latency_ms")?,
        request_id: row.get("request_id")?,
        report: json_value(row.get("report")?)?,
        choices: json_value(row.get("choices")?)?,
        usage: json_value(row.get("usage")?)?,
        system: json_value(row.get("system")?)?,
    })
}

pub(super) fn list_sessions(conn: &Connection, q: &SessionQuery) -> Result<SessionPage> {
    let limit = clamp_limit(q.limit);
    let mut sql = format!("SELECT {SESSION_COLUMNS} FROM sessions s WHERE 1 = 1");
    let mut params: Vec<Box<dyn ToSql>> = Vec::new();
    if let Some(tenant) = &q.tenant {
        sql.push_str(" AND s.tenant = ?");
        params.push(Box::new(tenant.clone()));
    }
    if let Some(after) = &q.after {
        let Keyset {
            updated_ms,
            tenant,
            id,
        } = match After::parse(after) {
            After::Cursor(position) => position,
            After::Session(id) => session_position(
                &id,
                q.tenant.as_deref(),
                sessions_named(conn, &id, q.tenant.as_deref())?,
            )?,
        };
        sql.push_str(
            " AND (s.updated_at < ? OR (s.updated_at = ? AND (s.tenant > ? \
             OR (s.tenant = ? AND s.id > ?))))",
        );
        params.push(Box::new(updated_ms));
        params.push(Box::new(updated_ms));
        params.push(Box::new(tenant.clone()));
        params.push(Box::new(tenant));
        params.push(Box::new(id));
    }
    sql.push_str(" ORDER BY s.updated_at DESC, s.tenant, s.id LIMIT ?");
    params.push(Box::new(limit + 1));
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(rusqlite::params_from_iter(params.iter()))?;
    let mut sessions = Vec::new();
    while let Some(row) = rows.next()? {
        sessions.push(session_from_row(row)?);
    }
    let more = sessions.len() as i64 > limit;
    sessions.truncate(limit as usize);
    let next = if more {
        sessions.last().map(encode_cursor)
    } else {
        None
    };
    Ok(SessionPage { sessions, next })
}

/// The list positions of the sessions called `id` (within `tenant` when given), by tenant.
/// Without a tenant this reads the whole `sessions_by_update` index: fine for an admin call.
fn sessions_named(conn: &Connection, id: &str, tenant: Option<&str>) -> Result<Vec<Keyset>> {
    // Two statements rather than `(? IS NULL OR tenant = ?)`, which hides the primary key.
    let row = |row: &Row<'_>| {
        Ok(Keyset {
            updated_ms: row.get(0)?,
            tenant: row.get(1)?,
            id: row.get(2)?,
        })
    };
    let found = match tenant {
        Some(tenant) => conn
            .prepare_cached(
                "SELECT updated_at, tenant, id FROM sessions WHERE tenant = ? AND id = ?",
            )?
            .query_map(params![tenant, id], row)?
            .collect::<rusqlite::Result<Vec<_>>>()?,
        None => conn
            .prepare_cached(
                "SELECT updated_at, tenant, id FROM sessions WHERE id = ? ORDER BY tenant LIMIT ?",
            )?
            .query_map(params![id, SESSION_LOOKUP_LIMIT], row)?
            .collect::<rusqlite::Result<Vec<_>>>()?,
    };
    Ok(found)
}

pub(super) fn insert_summary(
    conn: &Connection,
    tenant: &str,
    session: &str,
    s: &NewSummary,
) -> Result<Summary> {
    let created_at = Timestamp::now();
    let id: i64 = conn
        .prepare_cached(
            "INSERT INTO summaries (tenant, session_id, anchor_id, covers_until, text, \
             token_count, model, created_at, tools_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
             RETURNING id",
        )?
        .query_row(
            params![
                tenant,
                session,
                s.anchor.0,
                s.covers_until,
                s.text,
                s.token_count,
                s.model,
                created_at.millis(),
                tools_seen_json(s.tools_seen.as_deref())
            ],
            |row| row.get(0),
        )?;
    Ok(Summary {
        id,
        anchor: s.anchor,
        covers_until: s.covers_until,
        text: s.text.clone(),
        token_count: s.token_count,
        model: s.model.clone(),
        created_at,
        tools_seen: s.tools_seen.clone(),
    })
}

const SUMMARY_COLUMNS: &str =
    "x.id, x.anchor_id, x.covers_until, x.text, x.token_count, x.model, x.created_at, x.tools_seen";

fn summary_from_row(row: &Row<'_>) -> Result<Summary> {
    let anchor: Vec<u8> = row.get("anchor_id")?;
    Ok(Summary {
        id: row.get("id")?,
        anchor: id_from_bytes(&anchor)?,
        covers_until: row.get("covers_until")?,
        text: row.get("text")?,
        token_count: row.get("token_count")?,
        model: row.get("model")?,
        created_at: Timestamp(row.get("created_at")?),
        tools_seen: tools_seen_from(row.get("tools_seen")?),
    })
}

pub(super) fn latest_summary(
    conn: &Connection,
    tenant: &str,
    session: &str,
    leaf: Option<MessageId>,
) -> Result<Option<Summary>> {
    // Walk ids only (no bodies) up from the leaf and pick the best summary anchored on the path;
    // `CROSS JOIN` keeps the parent lookup on the primary key (see `tree::path`).
    let start = if leaf.is_some() {
        "id = ?3"
    } else {
        "id = (SELECT head_id FROM sessions WHERE tenant = ?1 AND id = ?2)"
    };
    let sql = format!(
        "WITH RECURSIVE path (id, parent_id) AS ( \
           SELECT id, parent_id FROM messages WHERE tenant = ?1 AND session_id = ?2 AND {start} \
           UNION ALL \
           SELECT m.id, m.parent_id FROM path p CROSS JOIN messages m \
           ON m.tenant = ?1 AND m.session_id = ?2 AND m.id = p.parent_id) \
         SELECT {SUMMARY_COLUMNS} FROM summaries x JOIN path p ON x.anchor_id = p.id \
         WHERE x.tenant = ?1 AND x.session_id = ?2 \
         ORDER BY x.covers_until DESC, x.created_at DESC, x.id DESC LIMIT 1"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let found = match leaf {
        Some(leaf) => stmt.query_row(params![tenant, session, leaf.0], |row| {
            Ok(summary_from_row(row))
        }),
        None => stmt.query_row(params![tenant, session], |row| Ok(summary_from_row(row))),
    };
    found.optional()?.transpose()
}

pub(super) fn list_summaries(
    conn: &Connection,
    tenant: &str,
    session: &str,
) -> Result<Vec<Summary>> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM summaries x WHERE x.tenant = ? AND x.session_id = ? \
         ORDER BY x.created_at, x.id"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![tenant, session])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(summary_from_row(row)?);
    }
    Ok(out)
}
