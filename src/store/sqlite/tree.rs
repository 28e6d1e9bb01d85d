//! The message tree on SQLite: appending chains, walking a path up from a leaf, listing the
//! leaves (branches), and the prefix lookup behind auto matching. Plain functions on a
//! connection; `append` runs inside the writer's transaction, the rest on a reader.

use std::collections::HashMap;
use std::sync::LazyLock;

use rusqlite::types::ToSql;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::super::next_head;
use super::super::time::Timestamp;
use super::super::types::*;
use crate::conversation::MessageId;
use crate::{Error, Result};

/// Ids per IN list; well under SQLite's limit of 32766 variables.
const CHUNK: usize = 500;
/// Ids in the first, tail-end window of a prefix lookup: covers a client resending its history
/// with a few new messages (a user message, or the results of parallel tool calls).
const FIRST_PROBE: usize = 8;
/// IN lists longer than [`SMALL`] are padded (with repeats of their last id) to a multiple of
/// this, so that the statement cache holds a few shapes instead of one per conversation length.
const PAD: usize = 50;
/// IN lists up to this long (a turn's new messages, a reply, the first window of a prefix
/// lookup: the usual case) are padded to a power of two only. SQLite builds a sorted table of
/// an IN list's values and seeks the index once per value, so padding one id to 50 made each
/// small lookup cost 50.
const SMALL: usize = 8;

/// The placeholders of an IN list of `n` ids, padded (see [`SMALL`] and [`PAD`]), and the
/// padded length. They are bare `?`s: SQLite numbers each one past the highest number used
/// before it, so the list follows the statement's numbered leading parameters, and one static
/// string serves every statement.
fn in_list(n: usize) -> (&'static str, usize) {
    static PLACEHOLDERS: LazyLock<String> = LazyLock::new(|| vec!["?"; CHUNK].join(", "));
    let padded = if n <= SMALL {
        n.max(1).next_power_of_two()
    } else {
        n.div_ceil(PAD) * PAD
    };
    // "?, " per id, without the last separator.
    (&PLACEHOLDERS[..padded * 3 - 2], padded)
}

/// `leading` followed by `ids`, padded to `padded` ids by repeating the last one (a repeat in
/// an IN list changes nothing).
fn with_ids<'a>(
    leading: &[&'a dyn ToSql],
    ids: &'a [MessageId],
    padded: usize,
) -> Vec<&'a dyn ToSql> {
    let mut params: Vec<&dyn ToSql> = Vec::with_capacity(leading.len() + padded);
    params.extend_from_slice(leading);
    params.extend(ids.iter().map(|id| &id.0 as &dyn ToSql));
    if let Some(last) = ids.last() {
        params.resize(leading.len() + padded, &last.0);
    }
    params
}

pub(super) fn append(
    conn: &Connection,
    tenant: &str,
    session: &str,
    parent: Option<MessageId>,
    messages: &[NewMessage],
) -> Result<Vec<Appended>> {
    let head: Option<Option<Vec<u8>>> = conn
        .prepare_cached("SELECT head_id FROM sessions WHERE tenant = ? AND id = ?")?
        .query_row(params![tenant, session], |row| row.get(0))
        .optional()?;
    let Some(head) = head else {
        return Err(Error::NotFound(format!("session '{session}' not found")));
    };
    let head = head.as_deref().map(id_from_bytes).transpose()?;

    // The head is stored, and with it its whole chain: a client resending its conversation to a
    // named session has everything up to the head skipped without looking it up.
    let all = messages;
    let known = head.and_then(|h| all.iter().rposition(|m| m.id == h));
    let (parent, messages) = match known {
        Some(k) => (Some(all[k].id), &all[k + 1..]),
        None => (parent, all),
    };

    let (mut seq, mut reply_seen) = match &parent {
        None => (0, false),
        Some(p) => {
            let row: Option<(i64, bool)> = conn
                .prepare_cached(
                    "SELECT seq, reply_in_prefix FROM messages \
                     WHERE tenant = ? AND session_id = ? AND id = ?",
                )?
                .query_row(params![tenant, session, p.0], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .optional()?;
            let (s, r) = row.ok_or_else(|| {
                Error::NotFound(format!("parent message {p} not in session '{session}'"))
            })?;
            (s + 1, r)
        }
    };

    // One lookup per 500 ids for what is already stored: a client resending its whole history
    // every turn costs one query, and only the new messages are inserted.
    let ids: Vec<MessageId> = messages.iter().map(|m| m.id).collect();
    let mut existing: HashMap<MessageId, bool> = HashMap::new();
    for chunk in ids.chunks(CHUNK) {
        let (list, padded) = in_list(chunk.len());
        let sql = format!(
            "SELECT id, reply_in_prefix FROM messages \
             WHERE tenant = ?1 AND session_id = ?2 AND id IN ({list})"
        );
        let mut stmt = conn.prepare_cached(&sql)?;
        let mut rows = stmt.query(&*with_ids(&[&tenant, &session], chunk, padded))?;
        while let Some(row) = rows.next()? {
            let id: Vec<u8> = row.get(0)?;
            existing.insert(id_from_bytes(&id)?, row.get(1)?);
        }
    }

    let now = Timestamp::now().millis();
    let mut insert = conn.prepare_cached(
        "INSERT INTO messages (tenant, session_id, id, parent_id, seq, origin, \
         reply_in_prefix, body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON CONFLICT (tenant, session_id, id) DO NOTHING",
    )?;
    let mut out = Vec::with_capacity(all.len());
    if let Some(k) = known {
        // `seq` is one past the head's.
        out.extend(all[..=k].iter().enumerate().map(|(i, m)| Appended {
            id: m.id,
            seq: seq - (k + 1 - i) as i64,
            new: false,
        }));
    }
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
                let done = insert.execute(params![
                    tenant,
                    session,
                    m.id.0,
                    prev.map(|p| p.0),
                    seq,
                    m.origin.as_str(),
                    reply_seen,
                    body,
                    now
                ])?;
                done == 1
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
            let child: Option<i64> = conn
                .prepare_cached(
                    "SELECT 1 FROM messages WHERE tenant = ? AND session_id = ? \
                     AND parent_id = ? LIMIT 1",
                )?
                .query_row(params![tenant, session, last.0], |row| row.get(0))
                .optional()?;
            child.is_none()
        }
        _ => true,
    };
    let new_head = next_head(head, last, any_new, last_is_leaf);
    if any_new || new_head != head {
        conn.prepare_cached(
            "UPDATE sessions SET head_id = ?, updated_at = ? WHERE tenant = ? AND id = ?",
        )?
        .execute(params![new_head.map(|h| h.0), now, tenant, session])?;
    }
    Ok(out)
}

/// The path ending at `leaf` (`None`: the session's head), root first.
/// The statement behind [`path`]: from the leaf (`?3`) or the session's head up to the root.
fn path_sql(from_leaf: bool) -> String {
    let start = if from_leaf {
        "id = ?3"
    } else {
        "id = (SELECT head_id FROM sessions WHERE tenant = ?1 AND id = ?2)"
    };
    // `path CROSS JOIN messages`: SQLite keeps that join order, so each step finds the parent
    // by its full primary key. Left to choose, it scanned the session's messages through
    // `messages_by_parent` at every step (quadratic: 4,000 messages took 4.5 s).
    format!(
        "WITH RECURSIVE path (id, parent_id, seq, origin, body, created_at) AS ( \
           SELECT id, parent_id, seq, origin, body, created_at FROM messages \
           WHERE tenant = ?1 AND session_id = ?2 AND {start} \
           UNION ALL \
           SELECT m.id, m.parent_id, m.seq, m.origin, m.body, m.created_at \
           FROM path p CROSS JOIN messages m \
           ON m.tenant = ?1 AND m.session_id = ?2 AND m.id = p.parent_id) \
         SELECT id, parent_id, seq, origin, body, created_at FROM path ORDER BY seq"
    )
}

pub(super) fn path(
    conn: &Connection,
    tenant: &str,
    session: &str,
    leaf: Option<MessageId>,
) -> Result<Vec<StoredMessage>> {
    let sql = path_sql(leaf.is_some());
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = match leaf {
        Some(leaf) => stmt.query(params![tenant, session, leaf.0])?,
        None => stmt.query(params![tenant, session])?,
    };
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(message_from_row(row)?);
    }
    Ok(out)
}

fn message_from_row(row: &Row<'_>) -> Result<StoredMessage> {
    let id: Vec<u8> = row.get("id")?;
    let parent: Option<Vec<u8>> = row.get("parent_id")?;
    let origin: String = row.get("origin")?;
    let body: String = row.get("body")?;
    Ok(StoredMessage {
        id: id_from_bytes(&id)?,
        parent: parent.as_deref().map(id_from_bytes).transpose()?,
        seq: row.get("seq")?,
        origin: Origin::parse(&origin),
        body: serde_json::from_str(&body)
            .map_err(|e| Error::Internal(format!("stored message body is not JSON: {e}")))?,
        created_at: Timestamp(row.get("created_at")?),
    })
}

pub(super) fn branches(conn: &Connection, tenant: &str, session: &str) -> Result<Vec<Branch>> {
    let mut stmt = conn.prepare_cached(
        "SELECT m.id, m.seq, m.created_at, (m.id = s.head_id) AS is_head \
         FROM messages m JOIN sessions s ON s.tenant = m.tenant AND s.id = m.session_id \
         WHERE m.tenant = ? AND m.session_id = ? AND NOT EXISTS ( \
           SELECT 1 FROM messages c \
           WHERE c.tenant = m.tenant AND c.session_id = m.session_id AND c.parent_id = m.id) \
         ORDER BY m.created_at DESC, m.seq DESC",
    )?;
    let mut rows = stmt.query(params![tenant, session])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let id: Vec<u8> = row.get("id")?;
        let seq: i64 = row.get("seq")?;
        let is_head: Option<bool> = row.get("is_head")?;
        out.push(Branch {
            id: id_from_bytes(&id)?,
            messages: seq + 1,
            updated_at: Timestamp(row.get("created_at")?),
            head: is_head.unwrap_or(false),
        });
    }
    Ok(out)
}

pub(super) fn find_by_prefix(
    conn: &Connection,
    tenant: &str,
    scope: &Scope,
    ids: &[MessageId],
    through: usize,
) -> Result<Option<PrefixMatch>> {
    let looked_up = &ids[..through.min(ids.len())];
    // Windows from the end: ids are chained, so a match in a later window is longer than any
    // in an earlier one and the first window that matches holds the answer. A client resending
    // its history matches all but its last message or two: one small probe, not one per id.
    for window in tail_first_windows(looked_up.len()) {
        let chunk = &looked_up[window];
        let (list, padded) = in_list(chunk.len());
        // `+m.session_id`: without it SQLite walks a whole tenant's messages in an index that
        // is ordered by session (to group without sorting) instead of looking the ids up.
        let sql = format!(
            "SELECT m.session_id, MAX(m.seq) AS matched, s.head_id, s.updated_at \
             FROM messages m JOIN sessions s ON s.tenant = m.tenant AND s.id = m.session_id \
             WHERE m.tenant = ?1 AND s.key_hash IS ?2 AND s.user_id IS ?3 \
             AND m.reply_in_prefix = 1 AND m.id IN ({list}) \
             GROUP BY +m.session_id, s.head_id, s.updated_at \
             ORDER BY matched DESC, s.updated_at DESC, m.session_id LIMIT {CANDIDATES}"
        );
        let params = with_ids(&[&tenant, &scope.key_hash, &scope.user], chunk, padded);
        let mut stmt = conn.prepare_cached(&sql)?;
        let candidates = stmt
            .query_map(&*params, |row| {
                let head: Option<Vec<u8>> = row.get("head_id")?;
                Ok(Candidate {
                    session_id: row.get("session_id")?,
                    matched: row.get("matched")?,
                    head: head.and_then(|h| id_from_bytes(&h).ok()),
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        if let Some(found) = pick_candidate(&candidates, ids) {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// The windows of a prefix lookup over `len` ids, last first: the final [`FIRST_PROBE`] ids,
/// then chunks of up to [`CHUNK`] going back to the start.
fn tail_first_windows(len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let tail = len.saturating_sub(FIRST_PROBE);
    let earlier = (0..tail.div_ceil(CHUNK)).map(move |k| {
        let end = tail - k * CHUNK;
        end.saturating_sub(CHUNK)..end
    });
    std::iter::once(tail..len)
        .filter(|w| !w.is_empty())
        .chain(earlier)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_lists_come_in_few_shapes_and_small_ones_stay_small() {
        let padded = |n| in_list(n).1;
        assert_eq!(
            (0..=8).map(padded).collect::<Vec<_>>(),
            [1, 1, 2, 4, 4, 8, 8, 8, 8]
        );
        assert_eq!([9, 50, 51, 499, 500].map(padded), [50, 50, 100, 500, 500]);
        let shapes: std::collections::HashSet<usize> = (0..=CHUNK).map(padded).collect();
        assert_eq!(shapes.len(), 4 + CHUNK / PAD);
        for n in 0..=CHUNK {
            let (list, padded) = in_list(n);
            assert!(padded >= n);
            assert_eq!(list.matches('?').count(), padded, "{n}");
        }
    }

    #[test]
    fn each_step_of_a_path_finds_the_parent_by_its_primary_key() {
        let conn = Connection::open_in_memory().unwrap();
        for m in crate::store::migrations::SQLITE {
            conn.execute_batch(m.sql).unwrap();
        }
        for from_leaf in [false, true] {
            let sql = format!("EXPLAIN QUERY PLAN {}", path_sql(from_leaf));
            let mut stmt = conn.prepare(&sql).unwrap();
            let n = stmt.parameter_count();
            let plan: Vec<String> = stmt
                .query_map(rusqlite::params_from_iter(vec![""; n]), |r| r.get(3))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            let step = plan
                .iter()
                .skip_while(|l| *l != "RECURSIVE STEP")
                .find(|l| l.contains(" m "))
                .unwrap_or_else(|| panic!("{plan:?}"));
            assert!(
                step.contains("(tenant=? AND session_id=? AND id=?)"),
                "{plan:?}"
            );
        }
    }

    #[test]
    fn windows_cover_every_id_once_from_the_end() {
        for len in [0, 1, 7, 8, 9, 200, 508, 509, 1500] {
            let windows: Vec<_> = tail_first_windows(len).collect();
            let covered: Vec<usize> = windows.iter().rev().flat_map(|w| w.clone()).collect();
            assert_eq!(covered, (0..len).collect::<Vec<_>>(), "len {len}");
            assert!(windows.iter().all(|w| !w.is_empty() && w.len() <= CHUNK));
            if len > 0 {
                assert_eq!(windows[0], len.saturating_sub(FIRST_PROBE)..len);
            }
        }
    }
}
