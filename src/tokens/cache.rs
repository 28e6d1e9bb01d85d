//! Bounded caches of per-message token counts (and other per-message results), keyed by
//! (encoding, message id, variant). A message id chains the whole prefix, so a hit means "this
//! message at this place in this conversation"; turn N+1 of a conversation then only tokenises
//! what is new. The variant tells apart what one id names but a count must not mix up (the
//! spelling of a message's call arguments, see `tokens::spelling`; a compression limit).
//!
//! Bounded by two generations: inserts go to `young`; when `young` is full, `old` is discarded
//! and `young` becomes `old`. A hit in `old` is promoted. This keeps recently used entries without
//! the bookkeeping of a true LRU.
//!
//! A request looks up its whole conversation at once ([`Memo::get_many`]) under one shared read
//! lock, so the per-message cost of a warm turn is a hash probe; writes (new counts, promotions)
//! take the write lock once per request. Locks are never held while tokenising.

use std::hash::{Hash, Hasher};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use foldhash::HashMap;

use crate::conversation::MessageId;

use super::Encoding;

/// Key of a per-message entry: encoding, message id, and a variant (for counts, the spelling of
/// what the id normalises; the compression limit for compressed results).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Key {
    encoding: Encoding,
    id: MessageId,
    variant: u64,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The id is a sha256: eight of its bytes are as good as all 32 for spreading keys, and
        // hashing a quarter of the bytes (with foldhash, seeded per process) makes the
        // per-message probe of a warm turn cheap. Equality still compares the whole key.
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&self.id.0[..8]);
        state.write_u64(u64::from_le_bytes(prefix) ^ self.variant);
        self.encoding.hash(state);
    }
}

struct Generations<V> {
    young: HashMap<Key, V>,
    /// Total weight of `young` (its length when every entry weighs one).
    young_weight: usize,
    old: HashMap<Key, V>,
}

/// Per-message token counts shared by every request of the process.
pub type CountCache = Memo<u64>;

/// A bounded map from (encoding, message id, variant) to a value derived from that message.
pub struct Memo<V> {
    maps: RwLock<Generations<V>>,
    /// Weight `young` may reach before it becomes `old`.
    capacity: usize,
    weigh: fn(&V) -> usize,
}

impl<V: Clone> Memo<V> {
    /// A cache holding at least `capacity` recent entries (and at most about twice that).
    pub fn new(capacity: usize) -> Self {
        Self::weighted(capacity, |_| 1)
    }

    /// A cache whose entries weigh `weigh(value)` each (say, the length of a vector), holding
    /// at least `capacity` weight of recent entries and at most about twice that (plus one
    /// entry).
    pub fn weighted(capacity: usize, weigh: fn(&V) -> usize) -> Self {
        Memo {
            maps: RwLock::new(Generations {
                young: HashMap::default(),
                young_weight: 0,
                old: HashMap::default(),
            }),
            capacity: capacity.max(1),
            weigh,
        }
    }

    // A poisoned lock only means another thread panicked mid-insert; the maps are still valid,
    // so keep using them.
    fn read(&self) -> RwLockReadGuard<'_, Generations<V>> {
        self.maps.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Generations<V>> {
        self.maps.write().unwrap_or_else(|e| e.into_inner())
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
        let key = Key {
            encoding,
            id: *id,
            variant,
        };
        {
            let maps = self.read();
            if let Some(v) = maps.young.get(&key) {
                return Some(v.clone());
            }
            if !maps.old.contains_key(&key) {
                return None;
            }
        }
        let mut maps = self.write();
        let v = match maps.old.remove(&key) {
            Some(v) => v,
            // Promoted by another thread in between.
            None => return maps.young.get(&key).cloned(),
        };
        self.put(&mut maps, key, v.clone());
        Some(v)
    }

    /// Records the value for one variant of a message.
    pub fn insert_variant(&self, encoding: Encoding, id: &MessageId, variant: u64, value: V) {
        let key = Key {
            encoding,
            id: *id,
            variant,
        };
        self.put(&mut self.write(), key, value);
    }

    /// The cached values of many messages at once, parallel to `ids` (each with the variant at
    /// its position in `variants`): one read lock for all of them, and one write lock only if
    /// some hits need promoting.
    pub fn get_many(
        &self,
        encoding: Encoding,
        ids: &[MessageId],
        variants: &[u64],
    ) -> Vec<Option<V>> {
        let keys = || {
            ids.iter().zip(variants).map(|(id, &variant)| Key {
                encoding,
                id: *id,
                variant,
            })
        };
        let mut out = Vec::with_capacity(ids.len());
        let mut in_old = false;
        {
            let maps = self.read();
            for k in keys() {
                let hit = match maps.young.get(&k) {
                    Some(v) => Some(v.clone()),
                    None => {
                        let v = maps.old.get(&k).cloned();
                        in_old |= v.is_some();
                        v
                    }
                };
                out.push(hit);
            }
        }
        if in_old {
            let mut maps = self.write();
            for k in keys() {
                if let Some(v) = maps.old.remove(&k) {
                    self.put(&mut maps, k, v);
                }
            }
        }
        out
    }

    /// Records many values (each under its message id and variant) under one write lock.
    pub fn insert_many(
        &self,
        encoding: Encoding,
        entries: impl IntoIterator<Item = (MessageId, u64, V)>,
    ) {
        let mut entries = entries.into_iter().peekable();
        if entries.peek().is_none() {
            return;
        }
        let mut maps = self.write();
        for (id, variant, value) in entries {
            let key = Key {
                encoding,
                id,
                variant,
            };
            self.put(&mut maps, key, value);
        }
    }

    fn put(&self, maps: &mut Generations<V>, key: Key, value: V) {
        let weight = (self.weigh)(&value);
        if maps.young_weight + weight > self.capacity && !maps.young.contains_key(&key) {
            maps.old = std::mem::take(&mut maps.young);
            maps.young_weight = 0;
        }
        maps.young_weight += weight;
        if let Some(previous) = maps.young.insert(key, value) {
            maps.young_weight -= (self.weigh)(&previous);
        }
    }

    /// Number of entries held (both generations).
    pub fn len(&self) -> usize {
        let maps = self.read();
        maps.young.len() + maps.old.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets everything (benchmarks use it to measure a cold cache).
    pub fn clear(&self) {
        let mut maps = self.write();
        maps.young.clear();
        maps.young_weight = 0;
        maps.old.clear();
    }
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
        assert!(cache.len() <= 2 * 64);
        assert_eq!(cache.get(Encoding::O200kBase, &id(9_999)), Some(9_999));
        assert_eq!(cache.get(Encoding::O200kBase, &id(0)), None);
    }

    #[test]
    fn weighted_cache_is_bounded_by_weight() {
        let cache: Memo<Vec<u64>> = Memo::weighted(100, Vec::len);
        for n in 0..50 {
            cache.insert(Encoding::O200kBase, &id(n), vec![0; 30]);
        }
        // Three entries of 30 fit in a generation of 100: at most two generations of three.
        assert!(cache.len() <= 6);
        assert!(cache.get(Encoding::O200kBase, &id(49)).is_some());
        assert!(cache.get(Encoding::O200kBase, &id(0)).is_none());
    }

    #[test]
    fn encodings_do_not_share_entries() {
        let cache = CountCache::new(64);
        cache.insert(Encoding::O200kBase, &id(1), 5);
        assert_eq!(cache.get(Encoding::Cl100kBase, &id(1)), None);
    }

    #[test]
    fn batch_lookup_finds_both_generations_and_promotes() {
        let cache = CountCache::new(4);
        for n in 0..6 {
            cache.insert(Encoding::O200kBase, &id(n), n as u64);
        }
        // 0..4 went to `old` when 4 and 5 arrived.
        let ids: Vec<MessageId> = (0..7).map(id).collect();
        let got = cache.get_many(Encoding::O200kBase, &ids, &[0; 7]);
        assert_eq!(
            got,
            vec![Some(0), Some(1), Some(2), Some(3), Some(4), Some(5), None]
        );
        cache.insert_many(Encoding::O200kBase, [(id(6), 0, 6), (id(7), 0, 7)]);
        assert_eq!(cache.get(Encoding::O200kBase, &id(7)), Some(7));
        assert!(cache.len() <= 2 * 4);
    }
}
