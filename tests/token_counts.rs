//! Our SPEC 5.1 counts must equal the reference Python `tiktoken`'s, computed once by
//! `tests/fixtures/gen_token_counts.py` into `tests/fixtures/token_counts.json`.

use ctxproxy::conversation::Message;
use ctxproxy::tokens::{Encoding, TokenCounter, message_tokens};
use serde_json::Value;

fn fixture() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/token_counts.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

const ENCODINGS: [(&str, Encoding); 2] = [
    ("o200k_base", Encoding::O200kBase),
    ("cl100k_base", Encoding::Cl100kBase),
];

#[test]
fn message_counts_match_reference_tiktoken() {
    let f = fixture();
    let cases = f["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for case in cases {
        let m: Message = serde_json::from_value(case["message"].clone()).unwrap();
        for (name, enc) in ENCODINGS {
            let want = case["tokens"][name].as_u64().unwrap();
            assert_eq!(message_tokens(enc, &m), want, "{name}: {}", case["message"]);
        }
    }
}

#[test]
fn text_counts_match_reference_tiktoken() {
    let f = fixture();
    let counter = TokenCounter::new();
    for t in f["texts"].as_array().unwrap() {
        let text = t["text"].as_str().unwrap();
        for (name, enc) in ENCODINGS {
            assert_eq!(
                counter.text(enc, text),
                t["tokens"][name].as_u64().unwrap(),
                "{name}: {text:?}"
            );
        }
    }
}
