//! Responses `item_reference`s to reply items the proxy stored, resolved to those items. A
//! client that sends its earlier replies back by reference (the Vercel AI SDK with `store`, its
//! default) would otherwise match nothing stored (a new branch or session every turn), count
//! as nothing against the budget while the upstream reads the whole item, and give the
//! summariser nothing to read. Resolved, the request is the conversation the client means:
//! matched, stored, rewritten, counted and sent as the items themselves.

use std::collections::HashMap;

use serde_json::Value;

use crate::conversation::responses_items::is_item_reference;
use crate::error::Result;
use crate::store::Store;

/// Replaces each reference in `items` to a reply item stored for the client key hashed as
/// `key_hash` by that item; returns how many were. References to anything else (an item only
/// the upstream holds, a message the client wrote) stay as they are.
pub async fn resolve_references(
    store: &dyn Store,
    tenant: &str,
    key_hash: Option<&str>,
    items: &mut [Value],
) -> Result<usize> {
    let ids: Vec<String> = items
        .iter()
        .filter_map(referenced_id)
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return Ok(0);
    }
    let found: HashMap<String, Value> = store
        .find_reply_items(tenant, key_hash, &ids)
        .await?
        .into_iter()
        .collect();
    let mut resolved = 0;
    for item in items.iter_mut() {
        let Some(stored) = referenced_id(item).and_then(|id| found.get(id)) else {
            continue;
        };
        *item = stored.clone();
        resolved += 1;
    }
    Ok(resolved)
}

/// Whether any of `items` refers to another item by its id.
pub fn has_references(items: &[Value]) -> bool {
    items.iter().any(|item| referenced_id(item).is_some())
}

/// The id an item refers to: an `item_reference`, typed, or in its short form (an `id` alone),
/// as the Responses mapping reads one.
fn referenced_id(item: &Value) -> Option<&str> {
    is_item_reference(item)
        .then(|| item.get("id")?.as_str())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_are_typed_or_an_id_alone() {
        assert_eq!(
            referenced_id(&json!({"type": "item_reference", "id": "msg_1"})),
            Some("msg_1")
        );
        assert_eq!(referenced_id(&json!({"id": "fc_1"})), Some("fc_1"));
        assert_eq!(
            referenced_id(&json!({"type": "message", "id": "msg_1", "role": "assistant"})),
            None
        );
        assert_eq!(
            referenced_id(&json!({"role": "user", "content": "hi"})),
            None
        );
    }
}
