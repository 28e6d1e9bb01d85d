//! The message tree on SQLite: appending chains, walking a path up from a leaf, listing the
//! leaves (branches), and the prefix lookup behind auto session matching.

use std::collections::HashMap;

use sqlx::sqlite::{Sqlite, SqlitePool, SqliteRow};
use sqlx::{QueryBuilder, Row};

use super::super::next_head;
use super::super::time::Timestamp;
use super::super::types::*;
use crate::conversation::MessageId;
use crate::{Error, Result};

/// Bound parameters per IN list; well under SQLite's limit of 32766 variables.
const CHUNK: usize = 500;

pub(super) async fn append(
    pool: &SqlitePool,
    tenant: &str,
    session: &str,
    parent: Option<MessageId>,
    messages: &[NewMessage],
) -> Result<Vec<Appended>> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let head: Option<Option<Vec<u8>>> =
        sqlx::query_scalar("SELECT head_id FROM sessions WHERE tenant = ? AND id = ?")
            .bind(tenant)
            .bind(session)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(head) = head else {
        return Err(Error::NotFound(format!("session '{session}' not found")));
    };
    let head = head.as_deref().map(id_from_bytes).transpose()?;

    let (mut seq, mut reply_seen) = match &parent {
        None => (0, false),
        Some(p) => {
            let row: Option<(i64, bool)> = sqlx::query_as(
                "SELECT seq, reply_in_prefix FROM messages \
                 WHERE tenant = ? AND session_id = ? AND id = ?",
            )
            .bind(tenant)
            .bind(session)
            .bind(&p.0[..])
            .fetch_optional(&mut *tx)
            .await?;
            let (s, r) = row.ok_or_else(|| {
                Error::NotFound(format!("parent message {p} not in session '{session}'"))
            })?;
            (s + 1, r)
        }
    };

    // One lookup for what is already stored, so a resent history costs one query, not N.
    let mut existing: HashMap<MessageId, bool> = HashMap::new();
    for chunk in messages.chunks(CHUNK) {
        let mut qb: QueryBuilder<Sqlite> =
            QueryBuilder::new("SELECT id, reply_in_prefix FROM messages WHERE tenant = ");
        qb.push_bind(tenant)
            .push(" AND session_id = ")
            .push_bind(session)
            .push(" AND id IN (");
        let mut list = qb.separated(", ");
        for m in chunk {
            list.push_bind(m.id.0.to_vec());
        }
        qb.push(")");
        for row in qb.build().fetch_all(&mut *tx).await? {
            let id: Vec<u8> = row.try_get("id")?;
            existing.insert(id_from_bytes(&id)?, row.try_get("reply_in_prefix")?);
        }
    }

    let now = Timestamp::now().millis();
    let mut out = Vec::with_capacity(messages.len());
    let mut prev = parent;
    for m in messages {
        let new = match existing.get(&m.id) {
            Some(flag) => {
                reply_seen = *flag;
                false
            }
            None => {
                reply_seen = reply_seen || m.origin == Origin::Reply;
                let body = serde_json::to_string(&m.body)
                    .map_err(|e| Error::Internal(format!("message body: {e}")))?;
                let done = sqlx::query(
                    "INSERT INTO messages (tenant, session_id, id, parent_id, seq, origin, \
                     reply_in_prefix, body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
                     ON CONFLICT (tenant, session_id, id) DO NOTHING",
                )
                .bind(tenant)
                .bind(session)
                .bind(m.id.0.to_vec())
                .bind(prev.map(|p| p.0.to_vec()))
                .bind(seq)
                .bind(m.origin.as_str())
                .bind(reply_seen)
                .bind(body)
                .bind(now)
                .execute(&mut *tx)
                .await?;
                done.rows_affected() == 1
            }
        };
        out.push(Appended { id: m.id, seq, new });
        prev = Some(m.id);
        seq += 1;
    }

    let any_new = out.iter().any(|a| a.new);
    let last = prev;
    let last_is_leaf = match (&last, any_new) {
        (Some(last), false) => {
            let child: Option<i64> = sqlx::query_scalar(
                "SELECT 1 FROM messages WHERE tenant = ? AND session_id = ? AND parent_id = ? \
                 LIMIT 1",
            )
            .bind(tenant)
            .bind(session)
            .bind(&last.0[..])
            .fetch_optional(&mut *tx)
            .await?;
            child.is_none()
        }
        _ => true,
    };
    let new_head = next_head(head, last, any_new, last_is_leaf);
    if any_new || new_head != head {
        sqlx::query("UPDATE sessions SET head_id = ?, updated_at = ? WHERE tenant = ? AND id = ?")
            .bind(new_head.map(|h| h.0.to_vec()))
            .bind(now)
            .bind(tenant)
            .bind(session)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(out)
}

/// The path ending at `leaf` (`None`: the session's head), root first.
pub(super) async fn path(
    pool: &SqlitePool,
    tenant: &str,
    session: &str,
    leaf: Option<MessageId>,
) -> Result<Vec<StoredMessage>> {
    const START_AT_HEAD: &str = "id = (SELECT head_id FROM sessions WHERE tenant = ?1 AND id = ?2)";
    const START_AT_ID: &str = "id = ?3";
    let start = if leaf.is_some() {
        START_AT_ID
    } else {
        START_AT_HEAD
    };
    let sql = format!(
        "WITH RECURSIVE path (id, parent_id, seq, origin, body, created_at) AS ( \
           SELECT id, parent_id, seq, origin, body, created_at FROM messages \
           WHERE tenant = ?1 AND session_id = ?2 AND {start} \
           UNION ALL \
           SELECT m.id, m.parent_id, m.seq, m.origin, m.body, m.created_at \
           FROM messages m JOIN path p ON m.id = p.parent_id \
           WHERE m.tenant = ?1 AND m.session_id = ?2) \
         SELECT id, parent_id, seq, origin, body, created_at FROM path ORDER BY seq"
    );
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(tenant)
        .bind(session);
    if let Some(leaf) = leaf {
        q = q.bind(leaf.0.to_vec());
    }
    q.fetch_all(pool)
        .await?
        .iter()
        .map(message_from_row)
        .collect()
}

fn message_from_row(row: &SqliteRow) -> Result<StoredMessage> {
    let id: Vec<u8> = row.try_get("id")?;
    let parent: Option<Vec<u8>> = row.try_get("parent_id")?;
    let origin: String = row.try_get("origin")?;
    let body: String = row.try_get("body")?;
    Ok(StoredMessage {
        id: id_from_bytes(&id)?,
        parent: parent.as_deref().map(id_from_bytes).transpose()?,
        seq: row.try_get("seq")?,
        origin: Origin::parse(&origin),
        body: serde_json::from_str(&body)
            .map_err(|e| Error::Internal(format!("stored message body is not JSON: {e}")))?,
        created_at: Timestamp(row.try_get("created_at")?),
    })
}

pub(super) async fn branches(
    pool: &SqlitePool,
    tenant: &str,
    session: &str,
) -> Result<Vec<Branch>> {
    let rows = sqlx::query(
        "SELECT m.id, m.seq, m.created_at, (m.id = s.head_id) AS is_head \
         FROM messages m JOIN sessions s ON s.tenant = m.tenant AND s.id = m.session_id \
         WHERE m.tenant = ? AND m.session_id = ? AND NOT EXISTS ( \
           SELECT 1 FROM messages c \
           WHERE c.tenant = m.tenant AND c.session_id = m.session_id AND c.parent_id = m.id) \
         ORDER BY m.created_at DESC, m.seq DESC",
    )
    .bind(tenant)
    .bind(session)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            let id: Vec<u8> = row.try_get("id")?;
            let seq: i64 = row.try_get("seq")?;
            let is_head: Option<bool> = row.try_get("is_head")?;
            Ok(Branch {
                id: id_from_bytes(&id)?,
                messages: seq + 1,
                updated_at: Timestamp(row.try_get("created_at")?),
                head: is_head.unwrap_or(false),
            })
        })
        .collect()
}

pub(super) async fn find_by_prefix(
    pool: &SqlitePool,
    tenant: &str,
    scope: &Scope,
    ids: &[MessageId],
) -> Result<Option<PrefixMatch>> {
    // Best over all chunks by (matched length, session updated_at).
    let mut best: Option<(i64, i64, String)> = None;
    for chunk in ids.chunks(CHUNK) {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "SELECT m.session_id, MAX(m.seq) AS matched, s.updated_at \
             FROM messages m JOIN sessions s ON s.tenant = m.tenant AND s.id = m.session_id \
             WHERE m.tenant = ",
        );
        qb.push_bind(tenant)
            .push(" AND s.key_hash IS ")
            .push_bind(scope.key_hash.clone())
            .push(" AND s.user_id IS ")
            .push_bind(scope.user.clone())
            .push(" AND m.reply_in_prefix = 1 AND m.id IN (");
        let mut list = qb.separated(", ");
        for id in chunk {
            list.push_bind(id.0.to_vec());
        }
        // `+m.session_id`: without it SQLite walks a whole tenant's messages in an index that
        // is ordered by session (to group without sorting) instead of looking the ids up.
        qb.push(
            ") GROUP BY +m.session_id, s.updated_at \
             ORDER BY matched DESC, s.updated_at DESC, m.session_id LIMIT 1",
        );
        if let Some(row) = qb.build().fetch_optional(pool).await? {
            let cand: (i64, i64, String) = (
                row.try_get("matched")?,
                row.try_get("updated_at")?,
                row.try_get("session_id")?,
            );
            if best.as_ref().is_none_or(|b| (cand.0, cand.1) > (b.0, b.1)) {
                best = Some(cand);
            }
        }
    }
    Ok(best.map(|(seq, _, session_id)| PrefixMatch {
        session_id,
        matched_len: (seq + 1) as usize,
    }))
}
