//! Where a page of the admin session list starts. The list is ordered by (updated_at DESC,
//! tenant, id), so a position in it is that triple; the proxy hands it out hex-encoded as the
//! opaque `next` cursor. OpenAI-style clients page differently, passing the id of the last item
//! they saw as `after`, so a session id is accepted too and turned into the same position by
//! looking the session up (each backend runs that lookup with its own SQL).

use super::types::Session;
use crate::{Error, Result};

/// A position in the session list: the (updated_at, tenant, id) of one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keyset {
    pub updated_ms: i64,
    pub tenant: String,
    pub id: String,
}

/// What the `after` of a session list names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum After {
    /// A cursor this proxy returned as `next`.
    Cursor(Keyset),
    /// Anything that does not decode as a cursor is taken for a session id.
    Session(String),
}

/// How many sessions sharing an id the lookup reads: two already make it ambiguous, a few more
/// let the error name the tenants.
pub(crate) const SESSION_LOOKUP_LIMIT: i64 = 5;

impl After {
    /// Reads the `after` parameter. A cursor is tried first: it is hex of
    /// "millis\ntenant\nid", which no session id a client would pick decodes to by accident.
    pub fn parse(after: &str) -> After {
        decode_cursor(after).map_or_else(|| After::Session(after.to_string()), After::Cursor)
    }
}

/// The cursor for the page after row `s`: hex, so it is opaque and URL-safe.
pub(crate) fn encode_cursor(s: &Session) -> String {
    hex::encode(format!("{}\n{}\n{}", s.updated_at.millis(), s.tenant, s.id))
}

/// Inverse of [`encode_cursor`]; `None` when `cursor` is not one.
fn decode_cursor(cursor: &str) -> Option<Keyset> {
    let text = String::from_utf8(hex::decode(cursor).ok()?).ok()?;
    if text.contains('\0') {
        // No session is named so; PostgreSQL's text could not even be asked.
        return None;
    }
    let mut parts = text.splitn(3, '\n');
    let (ms, tenant, id) = (parts.next()?, parts.next()?, parts.next()?);
    Some(Keyset {
        updated_ms: ms.parse().ok()?,
        tenant: tenant.to_string(),
        id: id.to_string(),
    })
}

/// The position of session `id`, given the rows (ordered by tenant, at most
/// [`SESSION_LOOKUP_LIMIT`]) the backend found with that id, within `tenant` when one was given.
/// None is the client's error, and so are several: session ids are unique only per tenant.
pub(crate) fn session_position(
    id: &str,
    tenant: Option<&str>,
    mut found: Vec<Keyset>,
) -> Result<Keyset> {
    let after = || Some("after".to_string());
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Error::invalid(
            match tenant {
                Some(t) => format!(
                    "'after' is neither a `next` cursor nor the id of a session of tenant '{t}'"
                ),
                None => "'after' is neither a `next` cursor nor a session id".to_string(),
            },
            after(),
        )),
        _ => {
            let tenants: Vec<&str> = found.iter().map(|k| k.tenant.as_str()).collect();
            Err(Error::invalid(
                format!(
                    "session id '{id}' exists in more than one tenant ({}); add `tenant=` to say \
                     which, or page with the `next` cursor",
                    tenants.join(", ")
                ),
                after(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyset(tenant: &str, id: &str) -> Keyset {
        Keyset {
            updated_ms: 1_700_000_000_000,
            tenant: tenant.into(),
            id: id.into(),
        }
    }

    #[test]
    fn cursor_round_trips_and_anything_else_is_a_session_id() {
        let cursor = hex::encode("1700000000000\nacme\nid\nwith newline");
        assert_eq!(
            After::parse(&cursor),
            After::Cursor(keyset("acme", "id\nwith newline"))
        );
        for id in [
            "0190f3c2-7b1e-7c4e-9d5a-3c1f2e4d5a6b",
            "s1",
            "zz",
            "",
            "abcd",
        ] {
            assert_eq!(After::parse(id), After::Session(id.to_string()));
        }
    }

    #[test]
    fn unknown_or_ambiguous_session_is_an_error_on_after() {
        let one = session_position("s", None, vec![keyset("a", "s")]).unwrap();
        assert_eq!(one, keyset("a", "s"));
        for found in [vec![], vec![keyset("a", "s"), keyset("b", "s")]] {
            let err = session_position("s", None, found).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidRequest { param: Some(p), .. } if p == "after"),
                "{err:?}"
            );
        }
        let err = session_position("s", None, vec![keyset("a", "s"), keyset("b", "s")]);
        assert!(err.unwrap_err().to_string().contains("(a, b)"));
    }
}
