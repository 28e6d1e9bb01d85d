//! PostgreSQL: request records, summaries and the admin session list.

use serde_json::Value;
use sqlx::postgres::{PgConnection, PgPool, PgRow, Postgres};
use sqlx::{QueryBuilder, Row};

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

pub(super) async fn insert_request(
    conn: &mut PgConnection,
    r: &NewRequestRecord,
) -> Result<RequestRecord> {
    let id = uuid::Uuid::now_v7().to_string();
    let time = r.arrived.unwrap_or_else(Timestamp::now);
    sqlx::query(
        "INSERT INTO requests (id, tenant, session_id, head_id, created_at, endpoint, model, \
         status, tokens_in, tokens_out, latency_ms, upstream_latency_ms, request_id, report, \
         choices, usage, system) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
         $13, $14::text::json, $15::text::json, $16::text::json, $17::text::json)",
    )
    .bind(&id)
    .bind(&r.tenant)
    .bind(&r.session)
    .bind(r.head.map(|h| h.0.to_vec()))
    .bind(time.millis())
    .bind(&r.endpoint)
    .bind(super::text::opt_text(r.model.as_deref()))
    .bind(i64::from(r.status))
    .bind(r.tokens_in)
    .bind(r.tokens_out)
    .bind(r.latency_ms)
    .bind(r.upstream_latency_ms)
    .bind(&r.request_id)
    .bind(json_text(&r.report)?)
    .bind(json_text(&r.choices)?)
    .bind(json_text(&r.usage)?)
    .bind(json_text(&r.system)?)
    .execute(&mut *conn)
    .await?;
    Ok(r.stored(id, time))
}

/// Records (or re-points) a Responses API id.
pub(super) async fn record_response(
    conn: &mut PgConnection,
    tenant: &str,
    response_id: &str,
    session: &str,
    message: MessageId,
    upstream_root: Option<&str>,
    key_hash: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO responses \
         (tenant, response_id, session_id, message_id, created_at, upstream_root, key_hash) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant, response_id) DO UPDATE SET \
         session_id = EXCLUDED.session_id, message_id = EXCLUDED.message_id, \
         created_at = EXCLUDED.created_at, upstream_root = EXCLUDED.upstream_root, \
         key_hash = EXCLUDED.key_hash",
    )
    .bind(tenant)
    .bind(super::text::text(response_id))
    .bind(session)
    .bind(message.0.to_vec())
    .bind(Timestamp::now().millis())
    .bind(super::text::opt_text(upstream_root))
    .bind(key_hash)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Records the reply items of `messages` that have an id of their own (Responses output
/// items), for `item_reference`s to them (see `Store::find_reply_items`).
pub(super) async fn record_reply_items(
    conn: &mut PgConnection,
    tenant: &str,
    session: &str,
    key_hash: Option<&str>,
    messages: &[NewMessage],
) -> Result<()> {
    for (item_id, message) in crate::store::reply_item_ids(messages) {
        sqlx::query(
            "INSERT INTO reply_items (tenant, item_id, key_hash, session_id, message_id) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, item_id, key_hash) DO UPDATE SET \
             session_id = EXCLUDED.session_id, message_id = EXCLUDED.message_id",
        )
        .bind(tenant)
        .bind(super::text::text(item_id))
        .bind(key_hash.unwrap_or_default())
        .bind(session)
        .bind(message.0.to_vec())
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The stored bodies of the reply items `item_ids` names, for `key_hash`.
pub(super) async fn find_reply_items(
    pool: &PgPool,
    tenant: &str,
    key_hash: Option<&str>,
    item_ids: &[String],
) -> Result<Vec<(String, Value)>> {
    let ids: Vec<String> = item_ids
        .iter()
        .map(|id| super::text::text(id).into_owned())
        .collect();
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT r.item_id, m.body::text FROM reply_items r JOIN messages m \
         ON m.tenant = r.tenant AND m.session_id = r.session_id AND m.id = r.message_id \
         WHERE r.tenant = $1 AND r.key_hash = $2 AND r.item_id = ANY($3)",
    )
    .bind(tenant)
    .bind(key_hash.unwrap_or_default())
    .bind(&ids)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(id, body)| {
            serde_json::from_str(&body)
                .map(|body| (id, body))
                .map_err(|e| Error::Internal(format!("stored message JSON: {e}")))
        })
        .collect()
}

pub(super) async fn list_requests(
    pool: &PgPool,
    tenant: &str,
    session: &str,
) -> Result<Vec<RequestRecord>> {
    let rows = sqlx::query(
        "SELECT id, tenant, session_id, head_id, created_at, endpoint, model, status, tokens_in, \
         tokens_out, latency_ms, upstream_latency_ms, request_id, report::text AS report, \
         choices::text AS choices, usage::text AS usage, system::text AS system \
         FROM requests WHERE tenant = $1 AND session_id = $2 ORDER BY created_at, id",
    )
    .bind(tenant)
    .bind(session)
    .fetch_all(pool)
    .await?;
    rows.iter().map(request_from_row).collect()
}

fn request_from_row(row: &PgRow) -> Result<RequestRecord> {
    let head: Option<Vec<u8>> = row.try_get("head_id")?;
    let status: i64 = row.try_get("status")?;
    Ok(RequestRecord {
        id: row.try_get("id")?,
        tenant: row.try_get("tenant")?,
        session: row.try_get("session_id")?,
        head: head.as_deref().map(id_from_bytes).transpose()?,
        time: Timestamp(row.try_get("created_at")?),
        endpoint: row.try_get("endpoint")?,
        model: row.try_get("model")?,
        status: u16::try_from(status).unwrap_or(0),
        tokens_in: row.try_get("tokens_in")?,
        tokens_out: row.try_get("tokens_out")?,
        latency_ms: row.try_get("latency_ms")?,
        upstream_latency_ms: row.try_get("upstream_latency_ms")?,
        request_id: row.try_get("request_id")?,
        report: json_value(row.try_get("report")?)?,
        choices: json_value(row.try_get("choices")?)?,
        usage: json_value(row.try_get("usage")?)?,
        system: json_value(row.try_get("system")?)?,
    })
}

pub(super) async fn list_sessions(pool: &PgPool, q: &SessionQuery) -> Result<SessionPage> {
    let limit = clamp_limit(q.limit);
    let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(format!(
        "SELECT {SESSION_COLUMNS} FROM sessions s WHERE 1 = 1"
    ));
    if let Some(tenant) = &q.tenant {
        qb.push(" AND s.tenant = ").push_bind(tenant.clone());
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
                sessions_named(pool, &id, q.tenant.as_deref()).await?,
            )?,
        };
        qb.push(" AND (s.updated_at < ")
            .push_bind(updated_ms)
            .push(" OR (s.updated_at = ")
            .push_bind(updated_ms)
            .push(" AND (s.tenant > ")
            .push_bind(tenant.clone())
            .push(" OR (s.tenant = ")
            .push_bind(tenant)
            .push(" AND s.id > ")
            .push_bind(id)
            .push("))))");
    }
    qb.push(" ORDER BY s.updated_at DESC, s.tenant, s.id LIMIT ")
        .push_bind(limit + 1);
    let rows = qb.build().fetch_all(pool).await?;
    let mut sessions = rows
        .iter()
        .map(session_from_row)
        .collect::<Result<Vec<_>>>()?;
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
/// Without a tenant this scans `sessions_by_update`: fine for an admin call.
async fn sessions_named(pool: &PgPool, id: &str, tenant: Option<&str>) -> Result<Vec<Keyset>> {
    // Two statements rather than `($2 IS NULL OR tenant = $2)`, which a generic plan would
    // answer without the primary key.
    let rows = match tenant {
        Some(tenant) => {
            sqlx::query("SELECT updated_at, tenant, id FROM sessions WHERE tenant = $1 AND id = $2")
                .bind(tenant)
                .bind(id)
                .fetch_all(pool)
                .await?
        }
        None => sqlx::query(
            "SELECT updated_at, tenant, id FROM sessions WHERE id = $1 ORDER BY tenant LIMIT $2",
        )
        .bind(id)
        .bind(SESSION_LOOKUP_LIMIT)
        .fetch_all(pool)
        .await?,
    };
    rows.iter()
        .map(|row| {
            Ok(Keyset {
                updated_ms: row.try_get("updated_at")?,
                tenant: row.try_get("tenant")?,
                id: row.try_get("id")?,
            })
        })
        .collect()
}

pub(super) async fn insert_summary(
    pool: &PgPool,
    tenant: &str,
    session: &str,
    s: &NewSummary,
) -> Result<Summary> {
    let created_at = Timestamp::now();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO summaries (tenant, session_id, anchor_id, covers_until, text, token_count, \
         model, created_at, tools_seen) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
    )
    .bind(tenant)
    .bind(session)
    .bind(s.anchor.0.to_vec())
    .bind(s.covers_until)
    .bind(super::text::text(&s.text))
    .bind(s.token_count)
    .bind(&s.model)
    .bind(created_at.millis())
    .bind(tools_seen_json(s.tools_seen.as_deref()))
    .fetch_one(pool)
    .await?;
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

fn summary_from_row(row: &PgRow) -> Result<Summary> {
    let anchor: Vec<u8> = row.try_get("anchor_id")?;
    Ok(Summary {
        id: row.try_get("id")?,
        anchor: id_from_bytes(&anchor)?,
        covers_until: row.try_get("covers_until")?,
        text: row.try_get("text")?,
        token_count: row.try_get("token_count")?,
        model: row.try_get("model")?,
        created_at: Timestamp(row.try_get("created_at")?),
        tools_seen: tools_seen_from(row.try_get("tools_seen")?),
    })
}

pub(super) async fn latest_summary(
    pool: &PgPool,
    tenant: &str,
    session: &str,
    leaf: Option<MessageId>,
) -> Result<Option<Summary>> {
    // The best summary anchored on the path (ids only, no bodies).
    let ids = super::tree::path_ids(pool, tenant, session, leaf).await?;
    if ids.is_empty() {
        return Ok(None);
    }
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM summaries x \
         WHERE x.tenant = $1 AND x.session_id = $2 AND x.anchor_id = ANY($3) \
         ORDER BY x.covers_until DESC, x.created_at DESC, x.id DESC LIMIT 1"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(tenant)
        .bind(session)
        .bind(ids)
        .fetch_optional(pool)
        .await?
        .as_ref()
        .map(summary_from_row)
        .transpose()
}

pub(super) async fn list_summaries(
    pool: &PgPool,
    tenant: &str,
    session: &str,
) -> Result<Vec<Summary>> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM summaries x WHERE x.tenant = $1 AND x.session_id = $2 \
         ORDER BY x.created_at, x.id"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(tenant)
        .bind(session)
        .fetch_all(pool)
        .await?;
    rows.iter().map(summary_from_row).collect()
}
