//! The model table: which encoding and context window a request's `model` implies. Built-in
//! globs cover OpenAI's models; the server file's `models:` map overrides them. Among the globs
//! that match, the most specific (most literal characters) wins, so `gpt-4o*` beats `gpt-4*`
//! whatever the order; user entries always beat built-ins.

use std::sync::LazyLock;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::Encoding;
use crate::error::{Error, Result};

/// What the pipeline needs to know about a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFacts {
    pub context_window: u64,
    pub encoding: Encoding,
}

impl ModelFacts {
    /// The facts for a model nobody described: approximate counting and 128k tokens.
    pub const UNKNOWN: ModelFacts = ModelFacts {
        context_window: 128_000,
        encoding: Encoding::Approximate,
    };
}

/// One entry of the `models:` map in the server file. `encoding` may be left out: then the
/// built-in table's encoding for the model is used (approximate if it has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    pub context_window: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
}

/// The `models:` map, glob → entry, in the order the file lists them (a plain map would lose the
/// order, which breaks ties between equally specific globs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelOverrides(pub Vec<(String, ModelEntry)>);

impl<'de> Deserialize<'de> for ModelOverrides {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ModelOverrides;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of model glob to {context_window, encoding}")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, ModelEntry>()? {
                    out.push((k, v));
                }
                Ok(ModelOverrides(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Globs compiled once, with their facts, searched most-specific-first.
struct Globs<T> {
    set: GlobSet,
    entries: Vec<(usize, T)>, // (specificity, facts), parallel to the set's globs
}

impl<T: Copy> Globs<T> {
    fn build<'a>(pairs: impl Iterator<Item = (&'a str, T)>) -> Result<Self> {
        let mut builder = GlobSetBuilder::new();
        let mut entries = Vec::new();
        for (pattern, facts) in pairs {
            let glob = Glob::new(pattern)
                .map_err(|e| Error::Config(format!("models: \"{pattern}\": {e}")))?;
            builder.add(glob);
            entries.push((specificity(pattern), facts));
        }
        let set = builder
            .build()
            .map_err(|e| Error::Config(format!("models: {e}")))?;
        Ok(Globs { set, entries })
    }

    fn best(&self, model: &str) -> Option<T> {
        let mut best: Option<(usize, T)> = None;
        // matches() lists indices in insertion order; keep the first of equal specificity.
        for i in self.set.matches(model) {
            let (spec, facts) = self.entries[i];
            if best.is_none_or(|(b, _)| spec > b) {
                best = Some((spec, facts));
            }
        }
        best.map(|(_, f)| f)
    }
}

fn specificity(pattern: &str) -> usize {
    pattern
        .chars()
        .filter(|c| !matches!(c, '*' | '?' | '[' | ']' | '{' | '}'))
        .count()
}

const O200K: Encoding = Encoding::O200kBase;
const CL100K: Encoding = Encoding::Cl100kBase;

/// OpenAI's published context windows (tokens of input plus output).
const BUILT_IN: &[(&str, u64, Encoding)] = &[
    ("gpt-5*", 400_000, O200K),
    ("gpt-5-chat*", 128_000, O200K),
    ("gpt-4.1*", 1_047_576, O200K),
    ("gpt-4.5*", 128_000, O200K),
    ("gpt-4o*", 128_000, O200K),
    ("chatgpt-4o*", 128_000, O200K),
    ("o1*", 200_000, O200K),
    ("o1-mini*", 128_000, O200K),
    ("o1-preview*", 128_000, O200K),
    ("o3*", 200_000, O200K),
    ("o4*", 200_000, O200K),
    ("gpt-4*", 8_192, CL100K),
    ("gpt-4-32k*", 32_768, CL100K),
    ("gpt-4-turbo*", 128_000, CL100K),
    ("gpt-4-*-preview", 128_000, CL100K),
    ("gpt-3.5*", 16_385, CL100K),
    // The first gpt-3.5-turbo snapshots had 4,096 (their -16k versions, 16,385).
    ("gpt-3.5-turbo-0301", 4_096, CL100K),
    ("gpt-3.5-turbo-0613", 4_096, CL100K),
    ("gpt-3.5-turbo-instruct*", 4_096, CL100K),
];

static BUILT_IN_GLOBS: LazyLock<Option<Globs<ModelFacts>>> = LazyLock::new(|| {
    Globs::build(BUILT_IN.iter().map(|&(p, context_window, encoding)| {
        (
            p,
            ModelFacts {
                context_window,
                encoding,
            },
        )
    }))
    .ok()
});

/// The built-in facts of a model (see [`ModelTable::lookup`] for fine-tuned ones).
fn built_in(model: &str) -> Option<ModelFacts> {
    BUILT_IN_GLOBS.as_ref()?.best(model)
}

/// The model a fine-tuned one (`ft:gpt-4o-mini-2024-07-18:org::id`) was tuned from.
fn tuned_from(model: &str) -> Option<&str> {
    model.strip_prefix("ft:")?.split(':').next()
}

/// The model table in force: the user's `models:` entries over the built-in ones.
pub struct ModelTable {
    user: Globs<ModelEntry>,
}

impl ModelTable {
    /// Compiles the user's entries; a malformed glob is an `Error::Config` naming it.
    pub fn new(overrides: &ModelOverrides) -> Result<Self> {
        let user = Globs::build(overrides.0.iter().map(|(p, e)| (p.as_str(), *e)))?;
        Ok(ModelTable { user })
    }

    /// The built-in table alone.
    pub fn built_in() -> Self {
        ModelTable {
            user: Globs {
                set: GlobSet::empty(),
                entries: Vec::new(),
            },
        }
    }

    /// The facts for `model` (never fails: unknown models get [`ModelFacts::UNKNOWN`]).
    pub fn lookup(&self, model: &str) -> ModelFacts {
        // A fine-tuned model has the facts of the model it was tuned from (as in tiktoken), the
        // user's table first, as for that model, unless something names it by its own name.
        let tuned = || tuned_from(model).map(|base| self.lookup(base));
        match self.user.best(model) {
            Some(entry) => ModelFacts {
                context_window: entry.context_window,
                encoding: entry
                    .encoding
                    .or_else(|| built_in(model).map(|b| b.encoding))
                    .or_else(|| tuned().map(|b| b.encoding))
                    .unwrap_or(Encoding::Approximate),
            },
            None => built_in(model)
                .or_else(tuned)
                .unwrap_or(ModelFacts::UNKNOWN),
        }
    }
}

impl Default for ModelTable {
    fn default() -> Self {
        Self::built_in()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fine_tuned_model_has_the_facts_of_its_base() {
        let table = ModelTable::built_in();
        let tuned = table.lookup("ft:gpt-4o-mini-2024-07-18:acme::9abc");
        assert_eq!(tuned, table.lookup("gpt-4o-mini-2024-07-18"));
        assert_eq!(tuned.encoding, Encoding::O200kBase);
        let old = table.lookup("ft:gpt-3.5-turbo-0125:acme::x");
        assert_eq!(old.encoding, Encoding::Cl100kBase);
        assert_eq!(table.lookup("ft:unknown:acme"), ModelFacts::UNKNOWN);
        assert_eq!(table.lookup("gpt-3.5-turbo-0613").context_window, 4_096);
        assert_eq!(
            table.lookup("gpt-3.5-turbo-16k-0613").context_window,
            16_385
        );
        assert_eq!(table.lookup("gpt-3.5-turbo-0125").context_window, 16_385);
    }

    fn facts(w: u64, e: Encoding) -> ModelFacts {
        ModelFacts {
            context_window: w,
            encoding: e,
        }
    }

    #[test]
    fn built_in_table_picks_the_most_specific_glob() {
        let t = ModelTable::built_in();
        assert_eq!(t.lookup("gpt-4o"), facts(128_000, O200K));
        assert_eq!(t.lookup("gpt-4o-mini-2024-07-18"), facts(128_000, O200K));
        assert_eq!(t.lookup("gpt-4.1-nano"), facts(1_047_576, O200K));
        assert_eq!(t.lookup("gpt-5-mini"), facts(400_000, O200K));
        assert_eq!(t.lookup("o3-mini"), facts(200_000, O200K));
        assert_eq!(t.lookup("o4-mini"), facts(200_000, O200K));
        assert_eq!(t.lookup("gpt-4"), facts(8_192, CL100K));
        assert_eq!(t.lookup("gpt-4-turbo"), facts(128_000, CL100K));
        assert_eq!(t.lookup("gpt-4-0125-preview"), facts(128_000, CL100K));
        assert_eq!(t.lookup("gpt-3.5-turbo"), facts(16_385, CL100K));
        assert_eq!(t.lookup("llama-3-70b"), ModelFacts::UNKNOWN);
    }

    #[test]
    fn user_entries_beat_built_ins_and_keep_built_in_encoding() {
        let yaml: ModelOverrides = serde_json::from_value(serde_json::json!({
            "gpt-4o*": {"context_window": 64000},
            "llama-*": {"context_window": 8192, "encoding": "cl100k_base"}
        }))
        .unwrap();
        let t = ModelTable::new(&yaml).unwrap();
        assert_eq!(t.lookup("gpt-4o-mini"), facts(64_000, O200K));
        assert_eq!(t.lookup("llama-3"), facts(8_192, CL100K));
        assert_eq!(t.lookup("gpt-4.1"), facts(1_047_576, O200K));
        // A fine-tuned model follows what the table says of its base, the user's part too,
        // unless a glob names it.
        assert_eq!(t.lookup("ft:gpt-4o-mini:acme::1"), facts(64_000, O200K));
        assert_eq!(t.lookup("ft:llama-3:acme::1"), facts(8_192, CL100K));
        let yaml: ModelOverrides =
            serde_json::from_value(serde_json::json!({"ft:*": {"context_window": 1000}})).unwrap();
        let t = ModelTable::new(&yaml).unwrap();
        assert_eq!(t.lookup("ft:gpt-4o-mini:acme::1"), facts(1_000, O200K));
        // A glob on the fine-tuned name without an encoding takes its base's, yours first.
        let yaml: ModelOverrides = serde_json::from_value(serde_json::json!({
            "gpt-4o-mini*": {"context_window": 1000, "encoding": "cl100k_base"},
            "ft:*:special::*": {"context_window": 100000}
        }))
        .unwrap();
        let t = ModelTable::new(&yaml).unwrap();
        assert_eq!(
            t.lookup("ft:gpt-4o-mini:special::x"),
            facts(100_000, CL100K)
        );
        assert_eq!(t.lookup("ft:gpt-4o-mini:org::x"), facts(1_000, CL100K));
    }

    #[test]
    fn model_entry_rejects_unknown_keys() {
        let r: std::result::Result<ModelEntry, _> =
            serde_json::from_value(serde_json::json!({"context_window": 1, "encodng": "x"}));
        assert!(r.is_err());
    }

    #[test]
    fn bad_glob_is_a_config_error() {
        let o = ModelOverrides(vec![(
            "gpt-[".into(),
            ModelEntry {
                context_window: 1,
                encoding: None,
            },
        )]);
        assert!(matches!(ModelTable::new(&o), Err(Error::Config(_))));
    }
}
