//! The plain YAML tree that `parse_all` cuts bad entries from between passes, and the record of
//! what it cut, so that paths found in later passes are told as they read in the file.

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What the next pass has to cut: an unknown key is dropped from its mapping; a missing
/// required field drops the entry that lacks it; anything else drops the entry at the path.
#[derive(Debug, PartialEq)]
pub(super) enum Kind {
    UnknownField(String),
    MissingField(String),
    Other,
}

/// A step of a key path: a mapping key, a list index, or something that cannot be followed.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Seg {
    Key(String),
    Index(usize),
    Opaque(String),
}

/// What has been cut from the tree so far, so later paths can be told in the file's terms.
#[derive(Default)]
pub(super) struct Cuts {
    /// List entries removed, in order: the list's path at the time and the index removed. Later
    /// entries of that list moved up by one, so a later path's index is moved back.
    removed_items: Vec<(Vec<Seg>, usize)>,
    /// Every entry cut, by its path in the file.
    cut: Vec<Vec<Seg>>,
}

impl Cuts {
    /// True once a list entry has been cut: the entries after it moved up by one.
    pub(super) fn shifted_indexes(&self) -> bool {
        !self.removed_items.is_empty()
    }

    /// The lists that lost an entry, as paths in the tree as cut, each once.
    pub(super) fn shortened_lists(&self) -> Vec<Vec<Seg>> {
        let mut lists: Vec<Vec<Seg>> = Vec::new();
        for (list, _) in &self.removed_items {
            if !lists.contains(list) {
                lists.push(list.clone());
            }
        }
        lists
    }

    /// Cuts the entry that an error of `kind` at `path` points at; false when there is nothing
    /// that can be cut.
    pub(super) fn cut(&mut self, tree: &mut Node, path: &[Seg], kind: &Kind) -> bool {
        let mut parent = path.to_vec();
        let last = match kind {
            Kind::UnknownField(field) if parent.last() != Some(&Seg::Key(field.clone())) => {
                Seg::Key(field.clone())
            }
            _ => match parent.pop() {
                Some(last) => last,
                None => return false,
            },
        };
        let Some(node) = tree.at_mut(&parent) else {
            return false;
        };
        let mut path = parent.clone();
        path.push(last.clone());
        let original = self.original(&path);
        match (node, last) {
            (Node::Map(entries), Seg::Key(key)) => {
                let before = entries.len();
                entries.retain(|(k, _)| !k.is_key(&key));
                if entries.len() == before {
                    return false;
                }
            }
            (Node::Seq(items), Seg::Index(index)) if index < items.len() => {
                items.remove(index);
                self.removed_items.push((parent, index));
            }
            _ => return false,
        }
        self.cut.push(original);
        true
    }

    /// `path` (in the tree as cut now) as it reads in the file.
    pub(super) fn original(&self, path: &[Seg]) -> Vec<Seg> {
        let mut path = path.to_vec();
        for (list, removed) in self.removed_items.iter().rev() {
            if path.len() > list.len()
                && path.starts_with(list)
                && let Seg::Index(i) = &mut path[list.len()]
                && *i >= *removed
            {
                *i += 1;
            }
        }
        path
    }

    /// True for a required field reported missing because an earlier pass cut it: the file's
    /// problem was reported then (a wrongly typed `max` is one problem, not two).
    pub(super) fn caused(&self, path: &[Seg], kind: &Kind) -> bool {
        let Kind::MissingField(field) = kind else {
            return false;
        };
        let mut path = path.to_vec();
        path.push(Seg::Key(field.clone()));
        self.cut.contains(&self.original(&path))
    }
}

/// A YAML document as a plain tree (aliases expanded), for the passes after the first.
#[derive(Debug, Clone)]
pub(super) enum Node {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Node {
    pub(super) fn at_mut(&mut self, path: &[Seg]) -> Option<&mut Node> {
        let Some((first, rest)) = path.split_first() else {
            return Some(self);
        };
        let next = match (self, first) {
            (Node::Map(entries), Seg::Key(key)) => entries
                .iter_mut()
                .find(|(k, _)| k.is_key(key))
                .map(|(_, v)| v)?,
            (Node::Seq(items), Seg::Index(i)) => items.get_mut(*i)?,
            _ => return None,
        };
        next.at_mut(rest)
    }

    pub(super) fn at(&self, path: &[Seg]) -> Option<&Node> {
        let Some((first, rest)) = path.split_first() else {
            return Some(self);
        };
        let next = match (self, first) {
            (Node::Map(entries), Seg::Key(key)) => entries
                .iter()
                .find(|(k, _)| k.is_key(key))
                .map(|(_, v)| v)?,
            (Node::Seq(items), Seg::Index(i)) => items.get(*i)?,
            _ => return None,
        };
        next.at(rest)
    }

    /// A number below zero.
    pub(super) fn is_negative(&self) -> bool {
        match self {
            Node::Int(i) => *i < 0,
            Node::Float(f) => *f < 0.0,
            _ => false,
        }
    }

    /// Whether this mapping key is the one a path names.
    fn is_key(&self, key: &str) -> bool {
        match self {
            Node::Str(s) => s == key,
            Node::Bool(b) => b.to_string() == key,
            Node::Int(i) => i.to_string() == key,
            Node::Uint(u) => u.to_string() == key,
            Node::Float(f) => f.to_string() == key,
            Node::Null | Node::Seq(_) | Node::Map(_) => false,
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NodeVisitor;

        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
                Ok(Node::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Int(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
                Ok(Node::Uint(v))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Node, E> {
                Ok(Node::Str(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<Node, E> {
                Ok(Node::Str(v))
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Node::Map(entries))
            }
        }

        d.deserialize_any(NodeVisitor)
    }
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Null => s.serialize_unit(),
            Node::Bool(b) => s.serialize_bool(*b),
            Node::Int(i) => s.serialize_i64(*i),
            Node::Uint(u) => s.serialize_u64(*u),
            Node::Float(f) => s.serialize_f64(*f),
            Node::Str(v) => s.serialize_str(v),
            Node::Seq(items) => s.collect_seq(items),
            Node::Map(entries) => s.collect_map(entries.iter().map(|(k, v)| (k, v))),
        }
    }
}
