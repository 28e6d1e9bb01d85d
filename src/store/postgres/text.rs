//! PostgreSQL's `text` cannot hold the NUL character, which JSON strings may carry: a request's
//! `user` or `model`, a provider's response id, a summary the model wrote. (Message bodies are
//! `json`, which keeps `\u0000` escaped.) Such values go through here on their way to a text
//! column, written or looked up: NUL becomes U+FFFD, the same way both times, so equal strings
//! stay equal and a request is not refused for a character the store cannot keep. SQLite keeps
//! them as they are.

use std::borrow::Cow;

/// `s` as a text column can hold it.
pub(super) fn text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(s)
    }
}

/// [`text`] of an optional value.
pub(super) fn opt_text(s: Option<&str>) -> Option<Cow<'_, str>> {
    s.map(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nul_changes() {
        assert!(matches!(text("plain"), Cow::Borrowed("plain")));
        assert_eq!(text("bo\0b"), "bo\u{FFFD}b");
        assert_eq!(opt_text(Some("\0")).as_deref(), Some("\u{FFFD}"));
        assert_eq!(opt_text(None), None);
    }
}
