//! Bounded caches of per-message token counts (and other per-message results), keyed by (encoding, message id). A message id
//! chains the whole prefix, so a hit means "this exact message at this exact place in this
//! conversation"; turn N+1 of a conversation then only tokenises what is new.
//!
//! Bounded by two generations per shard: inserts go to `young`; when `young` is full, `old` is
//! discarded and `young` becomes `old`. A hit in `old` is promoted. This keeps recently used
//! entries without the bookkeeping of a true LRU. Locks are held only for the map operation, never
//! while tokenising.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::conversation::MessageId;

use super::Encoding;

const SHARDS: usize = 16;

/// Key of a per-message entry: encoding, message id, and a variant (0 for counts; the
/// compression limit for compressed results).
type Key = (Encoding, MessageId, u64);

struct Shard<V> {
    young: HashMap<Key, V>,
    old: HashMap<Key, V>,
}

impl<V> Default for Shard<V> {
    fn default() -> Self {
        Shard {
            young: HashMap::new(),
            old: HashMap::new(),
        }
    }
}

/// Per-message token counts shared by every request of the process.
pub type CountCache = Memo<u64>;

/// A bounded, sharded map from (encoding, message id, variant) to a value derived from that
/// message.
pub struct Memo<V> {
    shards: Vec<Mutex<Shard<V>>>,
    per_shard: usize,
}

impl<V: Clone> Memo<V> {
    /// A cache holding at least `capacity` recent entries (and at most about twice that).
    pub fn new(capacity: usize) -> Self {
        Memo {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
        }
    }

    fn shard(&self, id: &MessageId) -> &Mutex<Shard<V>> {
        // The id is a sha256, so any byte is uniformly distributed.
        &self.shards[id.0[0] as usize % SHARDS]
    }

    /// The cached count, if any.
    pub fn get(&self, encoding: Encoding, id: &MessageId) -> Option<V> {
        self.get_variant(encoding, id, 0)
    }

    /// Records a count.
    pub fn insert(&self, encoding: Encoding, id: &MessageId, value: V) {
        self.insert_variant(encoding, id, 0, value)
    }

    /// The cached value for one variant of a message, if any.
    pub fn get_variant(&self, encoding: Encoding, id: &MessageId, variant: u64) -> Option<V> {
        let key = (encoding, *id, variant);
        // A poisoned lock only means another thread panicked mid-insert; the maps are still
        // valid, so keep using them.
        let mut shard = self.shard(id).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = shard.young.get(&key) {
            return Some(n.clone());
        }
        let n = shard.old.remove(&key)?;
        insert(&mut shard, key, n.clone(), self.per_shard);
        Some(n)
    }

    /// Records the value for one variant of a message.
    pub fn insert_variant(&self, encoding: Encoding, id: &MessageId, variant: u64, value: V) {
        let mut shard = self.shard(id).lock().unwrap_or_else(|e| e.into_inner());
        insert(&mut shard, (encoding, *id, variant), value, self.per_shard);
    }

    /// Number of entries held (both generations).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.young.len() + s.old.len()
            })
            .sum()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets everything (benchmarks use it to measure a cold cache).
    pub fn clear(&self) {
        for s in &self.shards {
            let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
            s.young.clear();
            s.old.clear();
        }
    }
}

fn insert<V>(shard: &mut Shard<V>, key: Key, value: V, per_shard: usize) {
    if shard.young.len() >= per_shard {
        shard.old = std::mem::take(&mut shard.young);
    }
    shard.young.insert(key, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> MessageId {
        let mut b = [0u8; 32];
        b[..4].copy_from_slice(&n.to_le_bytes());
        MessageId(b)
    }

    #[test]
    fn cache_stays_bounded_and_keeps_recent_entries() {
        let cache = CountCache::new(64);
        for n in 0..10_000 {
            cache.insert(Encoding::O200kBase, &id(n), n as u64);
        }
        assert!(cache.len() <= 2 * 64 + 2 * SHARDS);
        assert_eq!(cache.get(Encoding::O200kBase, &id(9_999)), Some(9_999));
        assert_eq!(cache.get(Encoding::O200kBase, &id(0)), None);
    }

    #[test]
    fn encodings_do_not_share_entries() {
        let cache = CountCache::new(64);
        cache.insert(Encoding::O200kBase, &id(1), 5);
        assert_eq!(cache.get(Encoding::Cl100kBase, &id(1)), None);
    }
}
