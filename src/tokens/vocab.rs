//! A BPE vocabulary held compactly: every token's bytes in one buffer, in rank order, with `u32`
//! offsets, and an open-addressing table of ranks keyed by a hash of the bytes. About 4 MB for
//! o200k_base (200k tokens), where a map of `Vec<u8>` per token costs ten times that.
//!
//! The source is a `.tiktoken` file (one `base64(token) rank` line per token), as OpenAI publishes
//! it; the ranks are the token ids and run 0, 1, 2, … in file order.

use std::hash::BuildHasher;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hashbrown::HashTable;

/// Token bytes by rank, and ranks by token bytes.
pub struct Vocab {
    /// All tokens back to back, rank 0 first.
    bytes: Vec<u8>,
    /// Token `r` is `bytes[offsets[r]..offsets[r + 1]]`.
    offsets: Vec<u32>,
    /// Ranks, found by hashing the bytes and comparing against `bytes`.
    ranks: HashTable<u32>,
    hasher: foldhash::fast::FixedState,
}

/// What is wrong with a `.tiktoken` file: the line (1-based) and why.
#[derive(Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub reason: &'static str,
}

impl Vocab {
    /// Parses a `.tiktoken` file. Ranks must be 0, 1, 2, … in order and tokens distinct.
    pub fn parse(file: &[u8]) -> Result<Vocab, ParseError> {
        let lines = file.split(|&b| b == b'\n').filter(|l| !l.is_empty());
        let count = lines.clone().count();
        let mut vocab = Vocab {
            // Base64 is 4/3 of the bytes; the rank column and newline make the file larger still.
            bytes: Vec::with_capacity(file.len() / 2),
            offsets: Vec::with_capacity(count + 1),
            ranks: HashTable::with_capacity(count),
            hasher: foldhash::fast::FixedState::default(),
        };
        vocab.offsets.push(0);
        let mut decoded = Vec::new();
        for (index, line) in lines.enumerate() {
            let error = |reason| ParseError {
                line: index + 1,
                reason,
            };
            let mut fields = line.split(|&b| b == b' ');
            let (Some(token), Some(rank), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(error("expected `base64 rank`"));
            };
            let rank: usize = std::str::from_utf8(rank)
                .ok()
                .and_then(|r| r.parse().ok())
                .ok_or(error("rank is not a number"))?;
            if rank != index {
                return Err(error("ranks must be 0, 1, 2, … in order"));
            }
            decoded.clear();
            STANDARD
                .decode_vec(token, &mut decoded)
                .map_err(|_| error("token is not base64"))?;
            if decoded.is_empty() {
                return Err(error("empty token"));
            }
            if vocab.rank(&decoded).is_some() {
                return Err(error("duplicate token"));
            }
            vocab.bytes.extend_from_slice(&decoded);
            let end = u32::try_from(vocab.bytes.len()).map_err(|_| error("file too large"))?;
            vocab.offsets.push(end);
            let hash = vocab.hasher.hash_one(&decoded[..]);
            let (offsets, bytes, hasher) = (&vocab.offsets, &vocab.bytes, &vocab.hasher);
            vocab.ranks.insert_unique(hash, rank as u32, |&r| {
                hasher.hash_one(token_bytes(bytes, offsets, r))
            });
        }
        vocab.bytes.shrink_to_fit();
        Ok(vocab)
    }

    /// The rank of a token, or `None` when `piece` is not one.
    #[inline]
    pub fn rank(&self, piece: &[u8]) -> Option<u32> {
        let hash = self.hasher.hash_one(piece);
        self.ranks.find(hash, |&r| self.token(r) == piece).copied()
    }

    /// The bytes of the token of rank `rank`.
    #[inline]
    pub fn token(&self, rank: u32) -> &[u8] {
        token_bytes(&self.bytes, &self.offsets, rank)
    }

    /// Bytes of the longest token.
    pub fn longest_token(&self) -> usize {
        self.offsets
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0)
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// True for a vocabulary without tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held on the heap (capacities, not lengths).
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
            + self.offsets.capacity() * size_of::<u32>()
            // one control byte per bucket besides the u32
            + self.ranks.capacity() * (size_of::<u32>() + 1)
    }
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vocab({} tokens)", self.len())
    }
}

fn token_bytes<'a>(bytes: &'a [u8], offsets: &[u32], rank: u32) -> &'a [u8] {
    let r = rank as usize;
    &bytes[offsets[r] as usize..offsets[r + 1] as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranks_and_finds_tokens() {
        let v = Vocab::parse(b"YQ== 0\nYg== 1\nYWI= 2\n").unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v.rank(b"a"), Some(0));
        assert_eq!(v.rank(b"ab"), Some(2));
        assert_eq!(v.rank(b"ba"), None);
        assert_eq!(v.token(1), b"b");
    }

    #[test]
    fn rejects_bad_lines() {
        assert_eq!(Vocab::parse(b"YQ== 1\n").unwrap_err().line, 1);
        assert_eq!(Vocab::parse(b"YQ== 0\n!!! 1\n").unwrap_err().line, 2);
        assert_eq!(Vocab::parse(b"YQ== 0\nYQ== 1\n").unwrap_err().line, 2);
        assert!(Vocab::parse(b"YQ==0\n").is_err());
    }
}
