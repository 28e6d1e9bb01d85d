//! YAML loading with errors that name the key path (`policy.token_budget.max_tokens`), which
//! serde-saphyr alone reports only as line and column. Type errors are reworded for people
//! editing YAML (`expected an integer` rather than serde-saphyr's `invalid u64`): SPEC section 1
//! quotes that wording for check-config. Every problem in a file is reported, not only the first
//! one serde stops at (`parse_all_emptying`).

mod tree;

use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;
use serde_saphyr::Error as YamlError;

use tree::{Cuts, Kind, Node, Seg};

/// A section left empty (`defaults:` with every entry commented out) is the section's defaults,
/// as a section left out is: YAML reads the empty value as null. For `deserialize_with`.
pub fn empty_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de> + Default,
{
    Ok(<Option<T> as serde::Deserialize>::deserialize(deserializer)?.unwrap_or_default())
}

/// More passes than any hand-written file has problems; a bound so a surprise cannot loop.
const MAX_PASSES: usize = 1000;

/// What [`parse_all_emptying`] read.
pub struct Parsed<T> {
    /// The value read with the bad entries cut out, and every list that lost an entry emptied.
    pub value: Option<T>,
    pub problems: Vec<String>,
    /// The key paths (`keys`, `tools.roles.viewer`) of the lists emptied in `value`: checks on
    /// the value say nothing true about them (their entries are not the file's).
    pub emptied: Vec<String>,
}

/// Parses `text` into `T` and reports every problem found, each naming its key path, not only
/// the first one serde stops at.
///
/// The first pass reads the text itself, so a valid file loads exactly as it always did. When it
/// fails, the text is read as a plain YAML tree; the entry the error points at (the misspelt key,
/// the wrongly typed value, or the entry lacking a required field) is cut from the tree and the
/// rest is read again, until it loads or nothing more can be cut. A file that is not YAML at all
/// has one problem, its syntax error. The value returned is the one read with the bad entries
/// cut out (defaults in their place), for the checks that follow reading; `None` when even that
/// failed.
///
/// A list that lost an entry is emptied in the value (its remaining entries would be named by
/// the wrong index) and named in [`Parsed::emptied`], so that checks on the rest of the file
/// still run and report their problems in the same pass.
pub fn parse_all_emptying<T: DeserializeOwned>(text: &str) -> Parsed<T> {
    let (value, problems, emptied) = parse_all_raw(text);
    Parsed {
        value,
        problems: problems.iter().map(|p| without_advice(p)).collect(),
        emptied,
    }
}

/// A parser message without advice meant for the parser's API user, which a config file's
/// author cannot act on.
fn without_advice(problem: &str) -> String {
    problem
        .trim_end_matches(", set DuplicateKeyPolicy in Options if acceptable")
        .to_string()
}

fn parse_all_raw<T: DeserializeOwned>(text: &str) -> (Option<T>, Vec<String>, Vec<String>) {
    let mut failure = match attempt::<T>(text) {
        Ok(value) => return (Some(value), Vec::new(), Vec::new()),
        Err(f) => f,
    };
    // Read with the same booleans as `attempt`: else `off` becomes `false` in the tree, and a
    // second YAML 1.1 boolean in the file would pass once the first is cut.
    let mut tree = match serde_saphyr::from_str_with_options::<Node>(text, yaml_options()) {
        Ok(tree) => tree,
        Err(e) => {
            let mut problems = vec![failure.render(&failure.path)];
            // Not YAML after all. Either the first problem was this syntax error, then it is
            // told with its position rather than a path that stops mid-key (`server.?`), or
            // the first problem came before it, then the syntax error is a second one.
            // Without the parser's `error: ` prefix: the line already says it is one.
            let text = first_line(&e.to_string());
            let syntax = text.strip_prefix("error: ").unwrap_or(&text).to_string();
            if failure.path.is_empty() || strip_position(&syntax) == failure.detail {
                problems[0] = syntax;
            } else {
                problems.push(syntax);
            }
            return (None, problems, Vec::new());
        }
    };
    failure.refine(&tree);
    let mut problems = vec![failure.render(&failure.path)];
    let mut cuts = Cuts::default();
    // Required keys whose bad value was cut, read again with an empty stand-in (`keys: all`
    // would otherwise stop the reading, and hide the rest of the file's problems).
    let mut stand_ins: Vec<Vec<Seg>> = Vec::new();
    let mut cut_next = true;
    for _ in 0..MAX_PASSES {
        if cut_next && !cuts.cut(&mut tree, &failure.path, &failure.kind) {
            break;
        }
        cut_next = true;
        let Ok(text) = serde_saphyr::to_string(&tree) else {
            break;
        };
        match attempt::<T>(&text) {
            Ok(value) if !cuts.shifted_indexes() && stand_ins.is_empty() => {
                return (Some(value), problems, Vec::new());
            }
            // With a list entry cut, later entries moved up: checks on the value would name
            // them by the wrong index. Those lists are emptied instead, and named, as are the
            // stand-ins (checks on them would speak of values the file does not hold).
            Ok(_) => {
                let lists = cuts.shortened_lists();
                for list in &lists {
                    if let Some(node) = tree.at_mut(list) {
                        *node = Node::Seq(Vec::new());
                    }
                }
                let emptied = lists
                    .iter()
                    .chain(&stand_ins)
                    .map(|l| display(&cuts.original(l)))
                    .collect();
                let value = serde_saphyr::to_string(&tree)
                    .ok()
                    .and_then(|text| attempt::<T>(&text).ok());
                return (value, problems, emptied);
            }
            Err(mut next) => {
                next.refine(&tree);
                if let Some(key) = stand_in::<T>(&mut tree, &next, &cuts) {
                    stand_ins.push(key);
                    cut_next = false;
                    continue;
                }
                // A problem without a path would carry a position in the rewritten text, not in
                // the file; the file has a problem already, so stop rather than mislead.
                if next.path.is_empty() {
                    break;
                }
                if !cuts.caused(&next.path, &next.kind) {
                    problems.push(next.render(&cuts.original(&next.path)));
                }
                failure = next;
            }
        }
    }
    (None, problems, Vec::new())
}

/// For a required key reported missing because an earlier pass cut its bad value, puts an
/// empty value in its place that reads (an empty list, mapping or string, whichever does), so
/// the next pass goes on; the key's path, or `None` (the tree as it was) when none reads or the
/// key was not cut.
fn stand_in<T: DeserializeOwned>(
    tree: &mut Node,
    missing: &Failure,
    cuts: &Cuts,
) -> Option<Vec<Seg>> {
    let Kind::MissingField(field) = &missing.kind else {
        return None;
    };
    if !cuts.caused(&missing.path, &missing.kind) {
        return None;
    }
    let mut path = missing.path.clone();
    path.push(Seg::Key(field.clone()));
    for empty in [
        Node::Seq(Vec::new()),
        Node::Map(Vec::new()),
        Node::Str(String::new()),
    ] {
        let Some(Node::Map(entries)) = tree.at_mut(&missing.path) else {
            return None;
        };
        entries.push((Node::Str(field.clone()), empty));
        let reads =
            serde_saphyr::to_string(&*tree)
                .ok()
                .is_some_and(|text| match attempt::<T>(&text) {
                    Ok(_) => true,
                    Err(next) => !next.path.starts_with(&path),
                });
        if reads {
            return Some(path);
        }
        if let Some(Node::Map(entries)) = tree.at_mut(&missing.path) {
            entries.pop();
        }
    }
    None
}

/// One pass's error: where it is, what kind it is, and its message without the path.
struct Failure {
    path: Vec<Seg>,
    kind: Kind,
    detail: String,
    /// The field wanted an unsigned integer.
    unsigned: bool,
}

impl Failure {
    /// serde-saphyr's error does not carry the value, so a negative number where an unsigned
    /// integer belongs would read "expected an integer", which -1 is: the value in the tree
    /// (as cut so far, where the path points) tells that case apart.
    fn refine(&mut self, tree: &Node) {
        if self.unsigned && tree.at(&self.path).is_some_and(Node::is_negative) {
            self.detail = "expected a non-negative integer".into();
        }
    }

    fn render(&self, path: &[Seg]) -> String {
        // serde names a missing field at its parent (the file itself for a top-level key):
        // the problem's key path is the field's own (`keys: required key is missing`).
        if let Kind::MissingField(field) = &self.kind {
            let mut path = path.to_vec();
            path.push(Seg::Key(field.clone()));
            return format!("{}: required key is missing", display(&path));
        }
        if path.is_empty() {
            self.detail.clone()
        } else {
            format!("{}: {}", display(path), self.detail)
        }
    }
}

/// The path as serde_path_to_error prints it: `policy.token_budget.max_tokens`, `keys[0].role`.
fn display(path: &[Seg]) -> String {
    let mut out = String::new();
    for (i, seg) in path.iter().enumerate() {
        match seg {
            Seg::Index(index) => out.push_str(&format!("[{index}]")),
            Seg::Key(s) | Seg::Opaque(s) => {
                if i > 0 {
                    out.push('.');
                }
                out.push_str(s);
            }
        }
    }
    out
}

/// YAML 1.2 booleans only: YAML 1.1's `yes`/`on`/`no`/`off` read as booleans would, for example,
/// turn `tools.role_from_header: yes` into trusting a client header unannounced.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! { strict_booleans: true }
}

fn attempt<T: DeserializeOwned>(text: &str) -> Result<T, Failure> {
    let mut failure: Option<Failure> = None;
    let options = yaml_options();
    let result = serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        serde_path_to_error::deserialize::<_, T>(de).map_err(|e| {
            let path: Vec<Seg> = e
                .path()
                .iter()
                .map(|seg| match seg {
                    Segment::Seq { index } => Seg::Index(*index),
                    Segment::Map { key } => Seg::Key(key.clone()),
                    other => Seg::Opaque(other.to_string()),
                })
                .collect();
            let inner = e.into_inner();
            let detail = if path.is_empty() {
                first_line(&inner.to_string())
            } else {
                plain_message(&inner)
                    .unwrap_or_else(|| strip_position(&first_line(&inner.to_string())))
            };
            failure = Some(Failure {
                path,
                kind: kind(&inner),
                detail,
                unsigned: unsigned(&inner),
            });
            inner
        })
    });
    result.map_err(|e| {
        failure.unwrap_or_else(|| Failure {
            path: Vec::new(),
            kind: Kind::Other,
            detail: first_line(&e.to_string()),
            unsigned: false,
        })
    })
}

fn kind(err: &YamlError) -> Kind {
    match innermost(err) {
        YamlError::SerdeUnknownField { field, .. } => Kind::UnknownField(field.clone()),
        YamlError::SerdeMissingField { field, .. } => Kind::MissingField(field.to_string()),
        _ => Kind::Other,
    }
}

fn unsigned(err: &YamlError) -> bool {
    matches!(
        innermost(err),
        YamlError::InvalidScalar {
            ty: "u8" | "u16" | "u32" | "u64" | "u128" | "usize",
            ..
        }
    )
}

fn innermost(mut err: &YamlError) -> &YamlError {
    while let YamlError::WithSnippet { error, .. } | YamlError::AliasError { error, .. } = err {
        err = error;
    }
    err
}

/// The wording for type errors, by what the field expected. serde-saphyr names Rust types
/// (`u64`, `floating point`); a config author thinks in integers, numbers and booleans.
fn plain_message(err: &YamlError) -> Option<String> {
    let expected = match innermost(err) {
        YamlError::InvalidScalar { ty, .. } => match *ty {
            "u8" | "u16" | "u32" | "u64" | "u128" | "usize" | "i8" | "i16" | "i32" | "i64"
            | "i128" | "isize" => "an integer",
            "f32" | "f64" | "floating point" => "a number",
            "boolean" | "bool" => "a boolean",
            "char" => "a single character",
            _ => return None,
        },
        YamlError::InvalidBooleanStrict { .. } => "a boolean",
        YamlError::NullIntoString { .. } => "a string",
        // serde-saphyr reads every scalar (string, number, boolean) through one path, so a list
        // or mapping where any scalar belongs says "string scalar" even for an integer field;
        // naming a string there would mislead.
        YamlError::Unexpected { expected, .. } => match *expected {
            "string scalar" => "a single value, not a list or mapping",
            "sequence start" => "a list",
            "mapping start" => "a mapping",
            _ => return None,
        },
        _ => return None,
    };
    Some(format!("expected {expected}"))
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().trim().to_string()
}

/// serde-saphyr adds the position to messages (`... at line L, column C`, or as a prefix
/// `error: line L column C: ` in older versions); with a key path that is noise, but keep the
/// position for syntax errors where no path exists.
fn strip_position(s: &str) -> String {
    let s = s.strip_prefix("error: ").unwrap_or(s);
    if s.starts_with("line ")
        && let Some(idx) = s.find(": ")
    {
        return s[idx + 2..].to_string();
    }
    if let Some(idx) = s.rfind(" at line ")
        && s[idx..].contains(", column ")
    {
        return s[..idx].to_string();
    }
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// The value only when no list was emptied, and the problems.
    fn parse_all<T: DeserializeOwned>(text: &str) -> (Option<T>, Vec<String>) {
        let parsed = parse_all_emptying::<T>(text);
        (
            parsed.value.filter(|_| parsed.emptied.is_empty()),
            parsed.problems,
        )
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        #[allow(dead_code)]
        max_tokens: u64,
    }
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[allow(dead_code)]
        budget: Inner,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Limits {
        #[serde(default)]
        size: u64,
        #[serde(default)]
        grace: u64,
    }
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Entry {
        #[allow(dead_code)]
        name: String,
        #[serde(default)]
        #[allow(dead_code)]
        weight: u64,
    }
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[serde(default)]
        limits: Limits,
        #[serde(default)]
        #[allow(dead_code)]
        window: Option<Inner>,
        #[serde(default)]
        entries: Vec<Entry>,
    }

    fn first<T: DeserializeOwned + std::fmt::Debug>(text: &str) -> String {
        let (value, problems) = parse_all::<T>(text);
        assert!(!problems.is_empty(), "{value:?}");
        problems[0].clone()
    }

    #[test]
    fn wrong_type_names_the_key_path() {
        let err = first::<Outer>("budget:\n  max_tokens: abc\n");
        assert_eq!(err, "budget.max_tokens: expected an integer");
        let err = first::<Outer>("budget:\n  max_tokens: 2.5\n");
        assert_eq!(err, "budget.max_tokens: expected an integer");
    }

    #[test]
    fn a_negative_number_for_an_unsigned_field_says_non_negative() {
        let err = first::<Outer>("budget:\n  max_tokens: -3\n");
        assert_eq!(err, "budget.max_tokens: expected a non-negative integer");
        // Also in a later pass, and in a list entry.
        let (_, problems) = parse_all::<Doc>(
            "limits: { size: x, grace: -1 }\nentries: [{ name: a, weight: -2 }]\n",
        );
        assert_eq!(
            problems,
            [
                "limits.size: expected an integer",
                "limits.grace: expected a non-negative integer",
                "entries[0].weight: expected a non-negative integer"
            ]
        );
    }

    #[test]
    fn unknown_key_names_the_key_path() {
        let err = first::<Outer>("budget:\n  max_tokenz: 3\n");
        assert!(err.contains("budget"), "{err}");
        assert!(err.contains("max_tokenz"), "{err}");
    }

    #[test]
    fn a_valid_file_has_no_problems() {
        let (value, problems) = parse_all::<Doc>("limits: { size: 3 }\nentries: [{ name: a }]\n");
        assert!(problems.is_empty(), "{problems:?}");
        let doc = value.unwrap();
        assert_eq!((doc.limits.size, doc.entries.len()), (3, 1));
    }

    #[test]
    fn every_problem_in_one_mapping_is_reported() {
        let (value, problems) =
            parse_all::<Doc>("limits:\n  size: lots\n  graec: 3\n  grace: soon\n");
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert_eq!(problems[0], "limits.size: expected an integer");
        assert!(problems[1].starts_with("limits"), "{problems:?}");
        assert!(
            problems[1].contains("unknown field `graec`"),
            "{problems:?}"
        );
        assert_eq!(problems[2], "limits.grace: expected an integer");
        // What could be read is returned, the bad entries left at their defaults.
        let doc = value.unwrap();
        assert_eq!((doc.limits.size, doc.limits.grace), (0, 0));
    }

    /// A wrongly typed required field is one problem, not also "missing field" after it is cut.
    #[test]
    fn a_cut_required_field_is_not_reported_again_as_missing() {
        let (_, problems) = parse_all::<Doc>("window: { max_tokens: lots }\nlimits: { size: x }\n");
        assert_eq!(
            problems,
            [
                "window.max_tokens: expected an integer",
                "limits.size: expected an integer"
            ]
        );
    }

    #[test]
    fn list_indexes_stay_those_of_the_file_after_an_entry_is_cut() {
        let (_, problems) = parse_all::<Doc>(
            "entries:\n  - weight: 1\n  - name: b\n    weight: x\n  - name: c\n    wieght: 2\n",
        );
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert_eq!(problems[0], "entries[0].name: required key is missing");
        assert_eq!(problems[1], "entries[1].weight: expected an integer");
        assert!(problems[2].starts_with("entries[2]"), "{problems:?}");
        assert!(problems[2].contains("wieght"), "{problems:?}");
    }

    #[test]
    fn a_syntax_error_is_one_problem_with_its_position() {
        let (value, problems) = parse_all::<Doc>("limits: {size: 1\n");
        assert!(value.is_none());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("line "), "{problems:?}");
    }

    #[test]
    fn a_syntax_error_after_another_problem_is_a_second_one() {
        let (value, problems) = parse_all::<Doc>("limits: [1]\nentries: {\n");
        assert!(value.is_none());
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(problems[0], "limits: expected a mapping");
        assert!(problems[1].contains("line 2"), "{problems:?}");
    }

    #[test]
    fn a_list_that_lost_an_entry_is_emptied_and_the_rest_still_read() {
        let parsed = parse_all_emptying::<Doc>(
            "entries:\n  - name: a\n  - weight: 1\nlimits: { size: 7, grace: x }\n",
        );
        assert_eq!(
            parsed.problems,
            [
                "entries[1].name: required key is missing",
                "limits.grace: expected an integer"
            ]
        );
        assert_eq!(parsed.emptied, ["entries"]);
        let doc = parsed.value.expect("the rest is read");
        assert!(doc.entries.is_empty());
        assert_eq!(doc.limits.size, 7);
    }
}
