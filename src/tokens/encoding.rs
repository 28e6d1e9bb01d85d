//! The tokenizers a model can use, and plain-text counting with each. o200k_base and cl100k_base
//! count exactly like tiktoken (tests/token_counts.rs checks against Python tiktoken,
//! tests/token_counts_bpe.rs against tiktoken-rs on random text): tiktoken's split
//! ([`super::pretokenize`]) then BPE ([`super::bpe`]) over a compact vocabulary
//! ([`super::vocab`]). Each encoding is built once per process, on first use, from OpenAI's
//! `.tiktoken` file compiled into the binary (`assets/`, as published; sha256 in assets/README.md).

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::bpe::count_piece;
use super::pretokenize::{CL100K_PIECES, O200K_PIECES, Splitter};
use super::vocab::Vocab;

/// A vocabulary and the split that goes with it.
struct Tokenizer {
    vocab: Vocab,
    splitter: Splitter,
    /// Bytes of the longest token: no text takes fewer tokens than its bytes over this.
    longest: usize,
}

impl Tokenizer {
    // The files and patterns are compiled in and checked by the tests, so failing here is a
    // build defect, not bad input.
    fn build(file: &[u8], pieces: &str) -> Tokenizer {
        let vocab = Vocab::parse(file).expect("compiled-in .tiktoken file parses");
        Tokenizer {
            longest: vocab.longest_token().max(1),
            vocab,
            splitter: Splitter::new(pieces).expect("compiled-in split pattern compiles"),
        }
    }

    fn count(&self, text: &str) -> u64 {
        self.splitter
            .pieces(text)
            .map(|piece| count_piece(&self.vocab, piece.as_bytes()) as u64)
            .sum()
    }
}

fn o200k_base() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        Tokenizer::build(
            include_bytes!("../../assets/o200k_base.tiktoken"),
            O200K_PIECES,
        )
    })
}

fn cl100k_base() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        Tokenizer::build(
            include_bytes!("../../assets/cl100k_base.tiktoken"),
            CL100K_PIECES,
        )
    })
}

/// How a model's text is turned into tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// GPT-4o, GPT-4.1, GPT-5 and the o-series.
    O200kBase,
    /// GPT-4 and GPT-3.5.
    Cl100kBase,
    /// Unknown models: `ceil(chars / 4)`, chars being Unicode scalar values.
    Approximate,
}

impl Encoding {
    /// The name used in configuration (`o200k_base`, `cl100k_base`, `approximate`).
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
            Encoding::Approximate => "approximate",
        }
    }

    /// The number of tokens of `text`. Special-token text such as `<|endoftext|>` is counted as
    /// ordinary text, as a provider does for user content.
    pub fn count(self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        match self {
            Encoding::O200kBase => o200k_base().count(text),
            Encoding::Cl100kBase => cl100k_base().count(text),
            Encoding::Approximate => (text.chars().count() as u64).div_ceil(4),
        }
    }

    /// A lower bound of [`count`](Self::count) from the length alone, without tokenising (or
    /// counting chars): every token covers at most the longest token's bytes, and an
    /// approximate token four chars of at most four bytes. Tells cheaply that a long text
    /// cannot fit a small limit.
    pub fn fewest_tokens(self, text: &str) -> u64 {
        let bytes = text.len() as u64;
        match self {
            Encoding::O200kBase => bytes.div_ceil(o200k_base().longest as u64),
            Encoding::Cl100kBase => bytes.div_ceil(cl100k_base().longest as u64),
            Encoding::Approximate => bytes.div_ceil(16),
        }
    }

    /// Builds the tokenizer now rather than on the first request that needs it.
    pub fn warm_up(self) {
        let _ = self.count("warm up");
    }
}

impl std::fmt::Display for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approximate_is_ceil_of_chars_over_four() {
        assert_eq!(Encoding::Approximate.count(""), 0);
        assert_eq!(Encoding::Approximate.count("abc"), 1);
        assert_eq!(Encoding::Approximate.count("abcd"), 1);
        assert_eq!(Encoding::Approximate.count("abcde"), 2);
        // chars, not bytes
        assert_eq!(Encoding::Approximate.count("東京東京東"), 2);
    }

    #[test]
    fn fewest_tokens_never_exceeds_the_count() {
        let texts = [
            String::new(),
            "hello world".to_string(),
            "=".repeat(5000),
            " ".repeat(3000),
            "東京".repeat(400),
            serde_json::json!({"k": (0..300).collect::<Vec<_>>()}).to_string(),
            "a1 ".repeat(1000),
        ];
        for e in [
            Encoding::O200kBase,
            Encoding::Cl100kBase,
            Encoding::Approximate,
        ] {
            for t in &texts {
                assert!(
                    e.fewest_tokens(t) <= e.count(t),
                    "{e}: {}",
                    &t[..t.len().min(20)]
                );
            }
            // A long text is known too long for a small limit without tokenising it.
            assert!(e.fewest_tokens(&"x".repeat(100_000)) > 100, "{e}");
        }
    }

    #[test]
    fn encodings_parse_from_config_names() {
        let e: Encoding = serde_json::from_str("\"o200k_base\"").unwrap();
        assert_eq!(e, Encoding::O200kBase);
        assert!(serde_json::from_str::<Encoding>("\"p50k\"").is_err());
    }
}
