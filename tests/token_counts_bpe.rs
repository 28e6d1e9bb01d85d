//! The counter (GitHub's `bpe-openai`) must give tiktoken's counts for any text, not only the
//! fixture's: compared with tiktoken-rs, the Rust port of the reference, on random text mixing
//! scripts, digits, punctuation, whitespace runs, apostrophes and special-token look-alikes.

use ctxproxy::tokens::Encoding;
use proptest::prelude::*;

fn reference(encoding: Encoding, text: &str) -> u64 {
    match encoding {
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton()
            .encode_ordinary(text)
            .len() as u64,
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton()
            .encode_ordinary(text)
            .len() as u64,
        Encoding::Approximate => encoding.count(text),
    }
}

/// Pieces chosen to hit the pre-tokeniser's edge cases (whitespace before a word, contractions,
/// digit runs, CR/LF runs, case changes, combining marks, emoji, CJK).
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z]{1,12}",
        "[0-9]{1,7}",
        "[ \t]{1,5}",
        "[\r\n]{1,3}",
        "[ \t\r\n]{1,6}",
        Just("'s".to_string()),
        Just("'LL".to_string()),
        Just("<|endoftext|>".to_string()),
        "[!-/:-@\\[-`{-~]{1,4}",
        "\\PC{1,6}",
        "[東京天気日本語]{1,4}",
        "[éàüñçÉ]{1,3}",
        Just("e\u{301}".to_string()),
        Just("👩‍👩‍👧‍👦".to_string()),
        "[A-Z][a-z]{0,6}",
        "[a-z]{1,5}[A-Z]{1,5}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn counts_equal_tiktoken(pieces in prop::collection::vec(piece(), 0..24)) {
        let text: String = pieces.concat();
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            prop_assert_eq!(encoding.count(&text), reference(encoding, &text), "{:?}: {:?}", encoding, text);
        }
    }
}

#[test]
fn large_json_counts_equal_tiktoken() {
    let rows: Vec<String> = (0..300)
        .map(|i| format!(r#"{{"id":"ord-{i}","total":{},"note":"customer asked about delivery window {i}"}}"#, i * 17 % 1000))
        .collect();
    let text = format!("{{\"orders\":[{}]}}\n\n   trailing   \n", rows.join(","));
    for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
        assert_eq!(encoding.count(&text), reference(encoding, &text));
    }
}
