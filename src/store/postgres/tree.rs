//! The message tree on PostgreSQL: appending chains, walking a path up from a leaf, listing the
//! leaves (branches), and the prefix lookup behind auto session matching.

use std::collections::{HashMap, HashSet};

use sqlx::Row;
use sqlx::postgres::{PgConnection, PgPool, PgRow};

use super::super::next_head;
use super::super::time::Timestamp;
use super::super::types::*;
use crate::conversation::MessageId;
use crate::{Error, Result};

pub(super) async fn append(
    pool: &PgPool,
    tenant: &str,
    session: &str,
    parent: Option<MessageId>,
    messages: &[NewMessage],
) -> Result<Vec<Appended>> {
    let mut tx = pool.begin().await?;
    let appended = append_in(&mut tx, tenant, session, parent, messages).await?;
    tx.commit().await?;
    Ok(appended)
}

/// [`append`] inside the caller's transaction.
pub(super) async fn append_in(
    tx: &mut PgConnection,
    tenant: &str,
    session: &str,
    parent: Option<MessageId>,
    messages: &[NewMessage],
) -> Result<Vec<Appended>> {
    // The row lock orders concurrent appends to one session for this short transaction.
    let head: Option<Option<Vec<u8>>> =
        sqlx::query_scalar("SELECT head_id FROM sessions WHERE tenant = $1 AND id = $2 FOR UPDATE")
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
                 WHERE tenant = $1 AND session_id = $2 AND id = $3",
            )
            .bind(tenant)
            .bind(session)
            .bind(p.0.to_vec())
            .fetch_optional(&mut *tx)
            .await?;
            let (s, r) = row.ok_or_else(|| {
                Error::NotFound(format!("parent message {p} not in session '{session}'"))
            })?;
            (s + 1, r)
        }
    };

    // One lookup for what is already stored, so a resent history costs one query, not N.
    let wanted: Vec<Vec<u8>> = messages.iter().map(|m| m.id.0.to_vec()).collect();
    let mut existing: HashMap<MessageId, bool> = HashMap::new();
    let rows = sqlx::query(
        "SELECT id, reply_in_prefix FROM messages \
         WHERE tenant = $1 AND session_id = $2 AND id = ANY($3)",
    )
    .bind(tenant)
    .bind(session)
    .bind(wanted)
    .fetch_all(&mut *tx)
    .await?;
    for row in rows {
        let id: Vec<u8> = row.try_get("id")?;
        existing.insert(id_from_bytes(&id)?, row.try_get("reply_in_prefix")?);
    }

    let now = Timestamp::now().millis();
    // What to insert, decided up front (nothing below depends on the inserts), then one
    // multi-row INSERT: a 200-message first request is one round trip, not 200.
    let mut rows = NewRows::default();
    let mut out = Vec::with_capacity(messages.len());
    let mut prev = parent;
    for m in messages {
        match existing.get(&m.id) {
            Some(flag) => reply_seen = *flag,
            None => {
                reply_seen = reply_seen || m.origin == Origin::Reply;
                rows.push(m, prev, seq, reply_seen)?;
            }
        }
        out.push(Appended {
            id: m.id,
            seq,
            new: false,
        });
        prev = Some(m.id);
        seq += 1;
    }
    if !rows.ids.is_empty() {
        let inserted: Vec<Vec<u8>> = sqlx::query_scalar(
            "INSERT INTO messages (tenant, session_id, id, parent_id, seq, origin, \
             reply_in_prefix, body, created_at) \
             SELECT $1, $2, m.id, m.parent_id, m.seq, m.origin, m.reply, m.body::json, $3 \
             FROM UNNEST($4::bytea[], $5::bytea[], $6::int8[], $7::text[], $8::bool[], \
             $9::text[]) AS m(id, parent_id, seq, origin, reply, body) \
             ON CONFLICT (tenant, session_id, id) DO NOTHING RETURNING id",
        )
        .bind(tenant)
        .bind(session)
        .bind(now)
        .bind(rows.ids)
        .bind(rows.parents)
        .bind(rows.seqs)
        .bind(rows.origins)
        .bind(rows.replies)
        .bind(rows.bodies)
        .fetch_all(&mut *tx)
        .await?;
        let inserted: HashSet<Vec<u8>> = inserted.into_iter().collect();
        for a in &mut out {
            a.new = inserted.contains(a.id.0.as_slice());
        }
    }

    let any_new = out.iter().any(|a| a.new);
    let last = prev;
    let last_is_leaf = match (&last, any_new) {
        (Some(last), false) => {
            let child: Option<i32> = sqlx::query_scalar(
                "SELECT 1 FROM messages WHERE tenant = $1 AND session_id = $2 \
                 AND parent_id = $3 LIMIT 1",
            )
            .bind(tenant)
            .bind(session)
            .bind(last.0.to_vec())
            .fetch_optional(&mut *tx)
            .await?;
            child.is_none()
        }
        _ => true,
    };
    let new_head = next_head(head, last, any_new, last_is_leaf);
    if any_new || new_head != head {
        sqlx::query(
            "UPDATE sessions SET head_id = $1, updated_at = $2 WHERE tenant = $3 AND id = $4",
        )
        .bind(new_head.map(|h| h.0.to_vec()))
        .bind(now)
        .bind(tenant)
        .bind(session)
        .execute(&mut *tx)
        .await?;
    }
    Ok(out)
}

/// The columns of the messages an append inserts, as arrays for one `UNNEST` insert.
#[derive(Default)]
struct NewRows {
    ids: Vec<Vec<u8>>,
    parents: Vec<Option<Vec<u8>>>,
    seqs: Vec<i64>,
    origins: Vec<&'static str>,
    replies: Vec<bool>,
    bodies: Vec<String>,
}

impl NewRows {
    fn push(
        &mut self,
        m: &NewMessage,
        parent: Option<MessageId>,
        seq: i64,
        reply_in_prefix: bool,
    ) -> Result<()> {
        let body = serde_json::to_string(&m.body)
            .map_err(|e| Error::Internal(format!("message body: {e}")))?;
        self.ids.push(m.id.0.to_vec());
        self.parents.push(parent.map(|p| p.0.to_vec()));
        self.seqs.push(seq);
        self.origins.push(m.origin.as_str());
        self.replies.push(reply_in_prefix);
        self.bodies.push(body);
        Ok(())
    }
}

/// The ids of the path ending at `leaf` (`None`: the session's head), leaf first. Every (id,
/// parent) of the session comes in one index range scan and the chain is walked here: a
/// recursive query leaves the planner to choose, at every step, how to find the parent, and
/// without statistics (a new or fast-growing table) it chose to scan the whole session each
/// time, 25 M rows for a 5,000-message session. This is linear in the session, whatever the
/// statistics say.
pub(super) async fn path_ids(
    pool: &PgPool,
    tenant: &str,
    session: &str,
    leaf: Option<MessageId>,
) -> Result<Vec<Vec<u8>>> {
    let rows = sqlx::query(
        "SELECT id, parent_id, (SELECT head_id FROM sessions WHERE tenant = $1 AND id = $2) AS head \
         FROM messages WHERE tenant = $1 AND session_id = $2",
    )
    .bind(tenant)
    .bind(session)
    .fetch_all(pool)
    .await?;
    let mut parents: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::with_capacity(rows.len());
    let mut head: Option<Vec<u8>> = None;
    for row in &rows {
        parents.insert(row.try_get("id")?, row.try_get("parent_id")?);
        if head.is_none() {
            head = row.try_get("head")?;
        }
    }
    let mut ids = Vec::new();
    let mut next = match leaf {
        Some(leaf) => Some(leaf.0.to_vec()),
        None => head,
    };
    // Ids are chained hashes, so the walk ends at the root; the bound only guards the loop.
    while let Some(id) = next.take() {
        let Some(parent) = parents.get(&id) else {
            break;
        };
        next = parent.clone();
        ids.push(id);
        if ids.len() > parents.len() {
            return Err(Error::Internal(format!(
                "session '{session}': the message chain loops"
            )));
        }
    }
    Ok(ids)
}

/// The path ending at `leaf` (`None`: the session's head), root first.
pub(super) async fn path(
    pool: &PgPool,
    tenant: &str,
    session: &str,
    leaf: Option<MessageId>,
) -> Result<Vec<StoredMessage>> {
    let ids = path_ids(pool, tenant, session, leaf).await?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query(
        "SELECT id, parent_id, seq, origin, body::text AS body, created_at FROM messages \
         WHERE tenant = $1 AND session_id = $2 AND id = ANY($3) ORDER BY seq",
    )
    .bind(tenant)
    .bind(session)
    .bind(ids)
    .fetch_all(pool)
    .await?
    .iter()
    .map(message_from_row)
    .collect()
}

fn message_from_row(row: &PgRow) -> Result<StoredMessage> {
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

pub(super) async fn branches(pool: &PgPool, tenant: &str, session: &str) -> Result<Vec<Branch>> {
    let rows = sqlx::query(
        "SELECT m.id, m.seq, m.created_at, (m.id = s.head_id) AS is_head \
         FROM messages m JOIN sessions s ON s.tenant = m.tenant AND s.id = m.session_id \
         WHERE m.tenant = $1 AND m.session_id = $2 AND NOT EXISTS ( \
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
    pool: &PgPool,
    tenant: &str,
    scope: &Scope,
    ids: &[MessageId],
    through: usize,
) -> Result<Option<PrefixMatch>> {
    // One query whatever the length: the ids travel as one bytea[] parameter. The matching
    // messages are found first, by id (`MATERIALIZED`), and only then joined to their sessions:
    // with statistics that lag a growing table, the planner otherwise starts from every session
    // of the tenant and probes each one's messages (measured: 250 ms for 26 k sessions and 200
    // ids that match nothing, against 0.1 ms this way).
    let wanted: Vec<Vec<u8>> = ids[..through.min(ids.len())]
        .iter()
        .map(|id| id.0.to_vec())
        .collect();
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH m AS MATERIALIZED ( \
           SELECT session_id, seq FROM messages \
           WHERE tenant = $1 AND reply_in_prefix AND id = ANY($4)) \
         SELECT m.session_id, MAX(m.seq) AS matched, s.head_id, s.updated_at \
         FROM m JOIN sessions s ON s.tenant = $1 AND s.id = m.session_id \
         WHERE s.key_hash IS NOT DISTINCT FROM $2 AND s.user_id IS NOT DISTINCT FROM $3 \
         GROUP BY m.session_id, s.head_id, s.updated_at \
         ORDER BY matched DESC, s.updated_at DESC, m.session_id LIMIT {CANDIDATES}"
    )))
    .bind(tenant)
    .bind(&scope.key_hash)
    .bind(super::text::opt_text(scope.user.as_deref()))
    .bind(wanted)
    .fetch_all(pool)
    .await?;
    let candidates = rows
        .iter()
        .map(|row| {
            let head: Option<Vec<u8>> = row.try_get("head_id")?;
            Ok(Candidate {
                session_id: row.try_get("session_id")?,
                matched: row.try_get("matched")?,
                head: head.as_deref().and_then(|h| id_from_bytes(h).ok()),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(pick_candidate(&candidates, ids))
}
