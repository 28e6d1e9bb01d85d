//! Splitting text into the pieces BPE merges within, exactly as tiktoken's regex does, without a
//! backtracking engine.
//!
//! tiktoken's patterns end in `…|\s+(?!\S)|\s+` (cl100k: `|\s`, the same there). The lookahead is the only thing a DFA cannot
//! run, and it is equivalent to two lookahead-free cases: a whitespace run reaching the end of the
//! text (`\s+$`, kept whole), or a run of two or more followed by a non-space, which gives up its
//! last character (`\s+\s`, then drop one char) so that it can prefix the next word. A run of
//! one falls through to `\s+`. So the split is one anchored leftmost-first search of three
//! patterns, in tiktoken's priority order:
//! `[alternatives before the lookahead]|\s+$`, then `\s+\s` (drop the last char), then `\s+`.
//! tests/token_counts_bpe.rs checks these patterns against tiktoken-rs's, and whole counts against
//! tiktoken (also tests/token_counts.rs).

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input, PatternID};

/// cl100k_base's pattern (tiktoken's current one, which puts `\s+$` before `\s*[\r\n]`) up to
/// the lookahead alternative, with its possessive quantifiers made greedy: in each place nothing
/// after the quantifier could match what giving back would free (a letter after a non-letter
/// prefix, a space before a non-space), so greedy and possessive match the same.
pub const CL100K_PIECES: &str = concat!(
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s+$|\s*[\r\n]",
);

/// o200k_base's pattern up to the lookahead alternative, then `\s+$`.
pub const O200K_PIECES: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+",
    r"|\s+$",
);

/// Whitespace run of two or more: the match minus its last char.
const SPACES_BEFORE_WORD: &str = r"\s+\s";
/// A single whitespace char before a word.
const SPACES: &str = r"\s+";

/// A compiled pre-tokeniser; `Sync`, so one per encoding serves every thread.
pub struct Splitter {
    regex: Regex,
}

impl Splitter {
    /// Compiles `pieces` (one of the `*_PIECES` patterns) with the whitespace fallbacks.
    pub fn new(pieces: &str) -> Result<Splitter, Box<regex_automata::meta::BuildError>> {
        let regex = Regex::new_many(&[pieces, SPACES_BEFORE_WORD, SPACES]).map_err(Box::new)?;
        Ok(Splitter { regex })
    }

    /// The pieces of `text`, in order; they cover it exactly.
    pub fn pieces<'t>(&'t self, text: &'t str) -> Pieces<'t> {
        Pieces {
            regex: &self.regex,
            input: Input::new(text).anchored(Anchored::Yes),
            text,
            at: 0,
        }
    }
}

/// Iterator over the pieces of one text.
pub struct Pieces<'t> {
    regex: &'t Regex,
    input: Input<'t>,
    text: &'t str,
    at: usize,
}

impl<'t> Iterator for Pieces<'t> {
    type Item = &'t str;

    fn next(&mut self) -> Option<&'t str> {
        if self.at >= self.text.len() {
            return None;
        }
        self.input.set_start(self.at);
        let end = match self.regex.search(&self.input) {
            Some(m) if m.pattern() == PatternID::must(1) => {
                // Give back the last whitespace char (it starts the next piece).
                let run = &self.text[m.start()..m.end()];
                m.end() - run.chars().next_back().map_or(0, char::len_utf8)
            }
            Some(m) => m.end(),
            // Unreachable: `\s+` and the other alternatives match at any char. Should it ever
            // happen, one char is a piece, which still counts every byte.
            None => {
                let rest = &self.text[self.at..];
                self.at + rest.chars().next().map_or(rest.len(), char::len_utf8)
            }
        };
        let piece = &self.text[self.at..end];
        self.at = end;
        Some(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pattern: &str, text: &str) -> Vec<String> {
        let s = Splitter::new(pattern).unwrap();
        s.pieces(text).map(str::to_string).collect()
    }

    #[test]
    fn whitespace_before_a_word_gives_its_last_char_to_the_word() {
        assert_eq!(split(O200K_PIECES, "a   b"), ["a", "  ", " b"]);
        assert_eq!(split(O200K_PIECES, "a \t\tb"), ["a", " \t", "\tb"]);
        assert_eq!(split(O200K_PIECES, "a   "), ["a", "   "]);
        assert_eq!(split(CL100K_PIECES, "x \n\n y"), ["x", " \n\n", " y"]);
        assert_eq!(split(CL100K_PIECES, "\t1"), ["\t", "1"]);
    }

    #[test]
    fn pieces_cover_the_text() {
        let text = "Hello, wörld!  12345 東京 👩‍👩‍👧 \r\n\r\n  end ";
        for p in [O200K_PIECES, CL100K_PIECES] {
            assert_eq!(split(p, text).concat(), text);
        }
    }
}
