//! A chat request's messages: the list as received, or the pipeline's rewrite of it read in
//! place. A rewrite keeps most of a long conversation as it is; writing the request from the
//! received messages and the positions kept, rather than moving each kept message into a new
//! list, makes a turn's rewrite cost what it changed, not how long the conversation is (#4).

use std::ops::Range;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Message;

/// One stretch of a rewritten conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// The received messages at these positions, as received (a run, so that a long unchanged
    /// stretch is one part).
    Kept(Range<usize>),
    /// A message the rewrite changed or made (boxed, so that a part stays small whatever it
    /// holds).
    Made(Box<Message>),
}

impl Part {
    /// How many messages this part sends.
    pub fn len(&self) -> usize {
        match self {
            Part::Kept(run) => run.len(),
            Part::Made(_) => 1,
        }
    }

    /// Whether it sends none (an empty run).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The messages `parts` send, read from `given` (the messages they were made over). A run
/// past the end of `given` reads what there is of it.
pub fn read<'m>(parts: &'m [Part], given: &'m [Message]) -> impl Iterator<Item = &'m Message> {
    parts.iter().flat_map(move |part| {
        let (kept, made) = match part {
            Part::Kept(run) => (given.get(run.clone()).unwrap_or_default(), None),
            Part::Made(m) => (&[][..], Some(&**m)),
        };
        kept.iter().chain(made)
    })
}

/// A chat request's messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Messages {
    /// As received.
    given: Vec<Message>,
    /// What is sent: `None` for every message of `given` in order.
    rewrite: Option<Vec<Part>>,
}

impl Messages {
    /// The messages as received.
    pub fn new(given: Vec<Message>) -> Messages {
        Messages {
            given,
            rewrite: None,
        }
    }

    /// A rewrite of `given` (see [`Part`]).
    pub fn rewritten(given: Vec<Message>, parts: Vec<Part>) -> Messages {
        Messages {
            given,
            rewrite: Some(parts),
        }
    }

    /// The messages sent, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Message> {
        let (whole, parts): (&[Message], &[Part]) = match &self.rewrite {
            None => (&self.given, &[]),
            Some(parts) => (&[], parts),
        };
        whole.iter().chain(read(parts, &self.given))
    }

    /// How many messages are sent.
    pub fn len(&self) -> usize {
        match &self.rewrite {
            None => self.given.len(),
            Some(parts) => parts.iter().map(Part::len).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The messages sent, as a list of their own: the received list itself when nothing was
    /// rewritten; otherwise the kept messages are moved out of it.
    pub fn into_vec(self) -> Vec<Message> {
        let Some(parts) = self.rewrite else {
            return self.given;
        };
        let mut slots: Vec<Option<Message>> = self.given.into_iter().map(Some).collect();
        let mut out = Vec::with_capacity(parts.iter().map(Part::len).sum());
        for part in parts {
            match part {
                Part::Kept(run) => {
                    let kept = slots.get_mut(run).unwrap_or_default().iter_mut();
                    out.extend(kept.filter_map(Option::take));
                }
                Part::Made(m) => out.push(*m),
            }
        }
        out
    }
}

impl Serialize for Messages {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Message>::deserialize(deserializer).map(Messages::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(text: &str) -> Message {
        serde_json::from_value(json!({"role": "user", "content": text, "x-keep": 1})).unwrap()
    }

    fn texts(m: &Messages) -> Vec<String> {
        m.iter().map(|m| m.text_content()).collect()
    }

    #[test]
    fn received_messages_go_as_received() {
        let given: Vec<Message> = ["a", "b", "c"].map(msg).into();
        let m = Messages::new(given.clone());
        assert_eq!(m.len(), 3);
        assert_eq!(texts(&m), ["a", "b", "c"]);
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::to_value(&given).unwrap()
        );
        let back: Messages = serde_json::from_value(serde_json::to_value(&given).unwrap()).unwrap();
        assert_eq!(back, m);
        assert_eq!(m.into_vec(), given);
    }

    #[test]
    fn a_rewrite_is_read_from_the_received_messages_in_its_order() {
        let given: Vec<Message> = ["a", "b", "c", "d", "e"].map(msg).into();
        let parts = vec![
            Part::Kept(0..1),
            Part::Made(Box::new(msg("new"))),
            Part::Kept(3..5),
            Part::Kept(1..2), // a result repair moved back: before, not after
        ];
        let m = Messages::rewritten(given, parts);
        let sent = ["a", "new", "d", "e", "b"];
        assert_eq!(texts(&m), sent);
        assert_eq!(m.len(), 5);
        let json = serde_json::to_value(&m).unwrap();
        let as_list: Vec<Message> = sent.map(msg).into();
        assert_eq!(json, serde_json::to_value(&as_list).unwrap());
        assert_eq!(json[0]["x-keep"], 1, "unknown fields kept");
        assert_eq!(m.into_vec(), as_list);
    }

    #[test]
    fn an_empty_rewrite_sends_nothing() {
        let m = Messages::rewritten(vec![msg("a")], Vec::new());
        assert!(m.is_empty());
        assert_eq!(serde_json::to_string(&m).unwrap(), "[]");
        assert!(m.into_vec().is_empty());
    }
}
