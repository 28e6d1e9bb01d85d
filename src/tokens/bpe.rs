//! Byte-pair merging of one piece, counting the tokens it ends as.
//!
//! The standard BPE of tiktoken: start from single bytes, repeatedly merge the adjacent pair
//! whose concatenation has the lowest rank (the leftmost one on a tie), stop when no adjacent
//! pair is a token. Most pieces are whole tokens, which one lookup settles.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

/// No merge: the pair is not a token.
const NONE: u32 = u32::MAX;

/// Above this many bytes a piece is merged with a heap, whose O(n log n) beats the scan's O(n²)
/// (a run of thousands of letters is one piece, and could otherwise stall a worker).
const SCAN_MAX_BYTES: usize = 256;

/// The number of tokens `piece` encodes to.
pub fn count_piece(vocab: &Vocab, piece: &[u8]) -> usize {
    if piece.len() <= 1 || vocab.rank(piece).is_some() {
        return piece.len().min(1);
    }
    if piece.len() <= SCAN_MAX_BYTES {
        merge(vocab, piece)
    } else {
        merge_long(vocab, piece)
    }
}

/// `parts[i]` is where part `i` starts (the last entry is the end of the piece), and `rank[i]`
/// the rank of part `i` joined with part `i + 1`. Each round scans for the lowest rank, so a
/// piece of n bytes costs O(n²) comparisons and two lookups per merge; pieces are words,
/// a few to a few dozen bytes.
fn merge(vocab: &Vocab, piece: &[u8]) -> usize {
    let n = piece.len();
    let mut parts: Vec<(usize, u32)> = Vec::with_capacity(n + 1);
    for i in 0..n {
        let rank = if i + 2 <= n {
            vocab.rank(&piece[i..i + 2]).unwrap_or(NONE)
        } else {
            NONE
        };
        parts.push((i, rank));
    }
    parts.push((n, NONE));
    // rank of parts i and i+1 joined, given the current boundaries
    let pair_rank = |parts: &[(usize, u32)], i: usize| -> u32 {
        if i + 2 < parts.len() {
            vocab
                .rank(&piece[parts[i].0..parts[i + 2].0])
                .unwrap_or(NONE)
        } else {
            NONE
        }
    };
    loop {
        let mut best = NONE;
        let mut at = 0;
        // the last entry is the end marker, never a pair start
        for (i, &(_, rank)) in parts[..parts.len() - 1].iter().enumerate() {
            if rank < best {
                best = rank;
                at = i;
            }
        }
        if best == NONE {
            break;
        }
        // part `at` absorbs part `at + 1`; its pair and its left neighbour's pair change
        parts.remove(at + 1);
        parts[at].1 = pair_rank(&parts, at);
        if at > 0 {
            parts[at - 1].1 = pair_rank(&parts, at - 1);
        }
    }
    parts.len() - 1
}

/// The same merges as [`merge`], in the same order: a heap of (rank, start) pops the lowest
/// rank, leftmost first, and entries left stale by a merge are skipped when popped. Parts are a
/// linked list over byte positions.
fn merge_long(vocab: &Vocab, piece: &[u8]) -> usize {
    let n = piece.len();
    // next[i] / prev[i]: where the parts after / before the part starting at i start
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
    let mut alive = vec![true; n];
    let mut heap = BinaryHeap::with_capacity(n);
    let rank_of = |start: usize, next: &[usize]| -> u32 {
        let second = next[start];
        if second >= n {
            return NONE;
        }
        vocab.rank(&piece[start..next[second]]).unwrap_or(NONE)
    };
    let mut pair: Vec<u32> = (0..n).map(|i| rank_of(i, &next)).collect();
    for (i, &rank) in pair.iter().enumerate() {
        if rank != NONE {
            heap.push(Reverse((rank, i)));
        }
    }
    let mut parts = n;
    while let Some(Reverse((rank, start))) = heap.pop() {
        if !alive[start] || pair[start] != rank {
            continue;
        }
        let absorbed = next[start];
        alive[absorbed] = false;
        next[start] = next[absorbed];
        if next[start] < n {
            prev[next[start]] = start;
        }
        parts -= 1;
        pair[start] = rank_of(start, &next);
        if pair[start] != NONE {
            heap.push(Reverse((pair[start], start)));
        }
        let before = prev[start];
        if before < n {
            pair[before] = rank_of(before, &next);
            if pair[before] != NONE {
                heap.push(Reverse((pair[before], before)));
            }
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    // bytes a, b, c, then "ab" (3), "bc" (4), "abc" (5)
    fn vocab() -> Vocab {
        Vocab::parse(b"YQ== 0\nYg== 1\nYw== 2\nYWI= 3\nYmM= 4\nYWJj 5\n").unwrap()
    }

    #[test]
    fn lowest_rank_merges_first() {
        let v = vocab();
        assert_eq!(count_piece(&v, b""), 0);
        assert_eq!(count_piece(&v, b"a"), 1);
        assert_eq!(count_piece(&v, b"abc"), 1);
        // "ab" (3) before "bc" (4): ab|c? no: "abc" is then one merge away -> 1
        assert_eq!(count_piece(&v, b"abcabc"), 2);
        // "bca": bc|a
        assert_eq!(count_piece(&v, b"bca"), 2);
        // "cab": c|ab
        assert_eq!(count_piece(&v, b"cab"), 2);
        // "aab": a|ab
        assert_eq!(count_piece(&v, b"aab"), 2);
    }

    #[test]
    fn heap_merge_equals_scan_merge() {
        let v = vocab();
        let texts: [&[u8]; 6] = [
            b"ab",
            b"abcabc",
            b"bca",
            b"cab",
            b"aab",
            b"aaaabbbbccccabcbcabbca",
        ];
        for t in texts {
            assert_eq!(merge_long(&v, t), merge(&v, t), "{t:?}");
        }
        let long = b"abcab".repeat(200);
        assert_eq!(merge_long(&v, &long), merge(&v, &long));
    }
}
