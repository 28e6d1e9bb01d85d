//! One managed request, either API, as the flow sees it: its conversation as wire JSON (taken
//! out to be assembled with stored history, put back rewritten), its tools, and the fields that
//! steer sessions. Every field the proxy does not read stays in the typed request's `extra`.

use serde_json::{Map, Value};

use super::body::parse_json;
use super::managed::Endpoint;
use super::shape;
use crate::conversation::{ChatRequest, Message, Messages, ResponsesRequest};
use crate::error::{Error, Result};
use crate::tokens::Spellings;

/// A request's conversation, taken out of it.
pub struct Taken {
    /// As wire JSON: what is hashed and stored.
    pub wire: Vec<Value>,
    /// Chat only: the same messages, typed.
    pub typed: Option<Typed>,
}

/// A chat request's messages as received, typed, with their spellings (see
/// [`Spellings`]), made in the pass that makes their wire JSON.
pub struct Typed {
    pub messages: Vec<Message>,
    pub spellings: Spellings,
}

/// A parsed managed request.
pub enum Call {
    Chat(ChatRequest),
    Responses(ResponsesRequest),
}

impl Call {
    /// Parses the body for `endpoint`; errors name the field at fault.
    pub fn parse(endpoint: Endpoint, bytes: &[u8]) -> Result<Call> {
        Ok(match endpoint {
            Endpoint::Chat => {
                let req: ChatRequest = parse_json(bytes)?;
                shape::check_chat(&req)?;
                Call::Chat(req)
            }
            Endpoint::Responses => {
                let req: ResponsesRequest = parse_json(bytes)?;
                shape::check_responses(&req)?;
                Call::Responses(req)
            }
        })
    }

    pub fn model(&self) -> &str {
        match self {
            Call::Chat(r) => &r.model,
            Call::Responses(r) => &r.model,
        }
    }

    pub fn is_stream(&self) -> bool {
        match self {
            Call::Chat(r) => r.is_stream(),
            Call::Responses(r) => r.is_stream(),
        }
    }

    pub fn user(&self) -> Option<&str> {
        match self {
            Call::Chat(r) => r.user.as_deref(),
            Call::Responses(r) => r.user.as_deref(),
        }
    }

    pub fn metadata_session_id(&self) -> Option<&str> {
        match self {
            Call::Chat(r) => r.metadata_session_id(),
            Call::Responses(r) => r.metadata_session_id(),
        }
    }

    /// A Responses request whose conversation is held elsewhere too (a `previous_response_id`,
    /// a `conversation`, a `prompt`): its `input` may be empty. Never for chat.
    pub fn continues_elsewhere(&self) -> bool {
        match self {
            Call::Chat(_) => false,
            Call::Responses(r) => r.continues_elsewhere(),
        }
    }

    pub fn previous_response_id(&self) -> Option<&str> {
        match self {
            Call::Chat(_) => None,
            Call::Responses(r) => r.previous_response_id.as_deref(),
        }
    }

    /// Whether the upstream holds history the proxy never saw: a `previous_response_id` it
    /// does not know (or the upstream-held root of a stored chain, once resolved), or an
    /// upstream `conversation`. Never for chat.
    pub fn upstream_holds_history(&self) -> bool {
        match self {
            Call::Chat(_) => false,
            Call::Responses(r) => r.previous_response_id.is_some() || r.in_upstream_conversation(),
        }
    }

    /// The `previous_response_id` the proxy may resolve from its store: none beside an upstream
    /// `conversation` (which OpenAI refuses with one), where the stored chain would resend what
    /// the conversation holds, so the request goes as received.
    pub fn previous_response_to_resolve(&self) -> Option<&str> {
        self.previous_response_id()
            .filter(|_| self.upstream_conversation_id().is_none())
    }

    /// The id of the upstream conversation a Responses request continues. Never for chat.
    pub fn upstream_conversation_id(&self) -> Option<&str> {
        match self {
            Call::Chat(_) => None,
            Call::Responses(r) => r.upstream_conversation_id(),
        }
    }

    /// Once the proxy resolved the id itself, the upstream's own state is not used: the id is
    /// replaced by the root of the stored chain, a response only the upstream holds, if it has
    /// one (SPEC 7), else dropped.
    pub fn set_previous_response_id(&mut self, id: Option<String>) {
        if let Call::Responses(r) = self {
            r.previous_response_id = id;
        }
    }

    /// A chat request's `metadata.session_id` is the proxy's to read, and OpenAI refuses any
    /// `metadata` on a chat completion that is not stored (`"store": true`): without `store`, the
    /// key is taken out before forwarding, and `metadata` with it when nothing else is left.
    /// With `store`, the client asked OpenAI to keep the metadata, and it goes as sent.
    pub fn drop_session_metadata(&mut self) {
        let Call::Chat(r) = self else {
            return;
        };
        if r.extra.get("store").and_then(Value::as_bool) == Some(true) {
            return;
        }
        let Some(Value::Object(metadata)) = &mut r.metadata else {
            return;
        };
        if metadata.shift_remove("session_id").is_some() && metadata.is_empty() {
            r.metadata = None;
        }
    }

    /// The Responses request's `instructions` (counted as its system message).
    pub fn instructions(&self) -> Option<&Value> {
        match self {
            Call::Chat(_) => None,
            Call::Responses(r) => r.instructions.as_ref(),
        }
    }

    /// The request's `tools`, if it has any.
    pub fn tools_mut(&mut self) -> &mut Option<Vec<Value>> {
        match self {
            Call::Chat(r) => &mut r.tools,
            Call::Responses(r) => &mut r.tools,
        }
    }

    /// Leaves out, with `tools`, the options OpenAI accepts only beside them: `tool_choice`
    /// (a mode, or an object: one naming a tool the role may not use was refused before this,
    /// and any other names no tool that is left) and `parallel_tool_calls`.
    pub fn drop_tool_options(&mut self) {
        match self {
            Call::Chat(r) => {
                r.tools = None;
                r.tool_choice = None;
                r.extra.remove("parallel_tool_calls");
            }
            Call::Responses(r) => {
                r.tools = None;
                r.extra.remove("tool_choice");
                r.extra.remove("parallel_tool_calls");
            }
        }
    }

    /// A chat request's fields that the proxy does not type (where the deprecated `functions`
    /// and `function_call` are); `None` for Responses.
    pub fn chat_extra_mut(&mut self) -> Option<&mut Map<String, Value>> {
        match self {
            Call::Chat(r) => Some(&mut r.extra),
            Call::Responses(_) => None,
        }
    }

    pub fn tool_choice(&self) -> Option<&Value> {
        match self {
            Call::Chat(r) => r.tool_choice.as_ref(),
            Call::Responses(r) => r.extra.get("tool_choice"),
        }
    }

    /// The conversation as wire JSON, taken out of the request (chat messages, or Responses
    /// input items; a string input is one user message), with the typed chat messages it was
    /// encoded from, so the pipeline need not parse them again.
    pub fn take_conversation(&mut self) -> Result<Taken> {
        match self {
            Call::Chat(r) => {
                let messages = std::mem::take(&mut r.messages).into_vec();
                let mut spellings = Spellings::with_capacity(messages.len());
                let wire = messages
                    .iter()
                    .map(|m| {
                        spellings.push(m);
                        serde_json::to_value(m)
                            .map_err(|e| Error::Internal(format!("cannot encode a message: {e}")))
                    })
                    .collect::<Result<_>>()?;
                Ok(Taken {
                    wire,
                    typed: Some(Typed {
                        messages,
                        spellings,
                    }),
                })
            }
            Call::Responses(r) => Ok(Taken {
                wire: match std::mem::take(&mut r.input) {
                    Value::Null => {
                        r.input_absent = true;
                        Vec::new()
                    }
                    Value::String(s) => {
                        let mut m = Map::new();
                        m.insert("role".into(), Value::String("user".into()));
                        m.insert("content".into(), Value::String(s));
                        vec![Value::Object(m)]
                    }
                    Value::Array(items) => items,
                    _ => Vec::new(),
                },
                typed: None,
            }),
        }
    }

    /// Puts the (rewritten) conversation back.
    pub fn put_chat_messages(&mut self, messages: Messages) {
        if let Call::Chat(r) = self {
            r.messages = messages;
        }
    }

    /// Puts the Responses input items back. A request that sent no `input` (its conversation is
    /// elsewhere) gets none added when there is nothing to send.
    pub fn put_items(&mut self, items: Vec<Value>) {
        if let Call::Responses(r) = self {
            r.input = if items.is_empty() && r.input_absent {
                Value::Null
            } else {
                Value::Array(items)
            };
        }
    }

    /// The JSON body to send upstream.
    pub fn to_body(&self) -> Result<Vec<u8>> {
        let encoded = match self {
            Call::Chat(r) => serde_json::to_vec(r),
            Call::Responses(r) => serde_json::to_vec(r),
        };
        encoded.map_err(|e| Error::Internal(format!("cannot encode the request: {e}")))
    }
}

/// Typed messages from stored or received wire JSON; a message that is not a valid chat message
/// is the client's error, named by its index.
pub fn chat_messages(wire: &[Value]) -> Result<Vec<Message>> {
    wire.iter()
        .enumerate()
        .map(|(i, v)| {
            Message::deserialize_value(v).map_err(|e| {
                Error::invalid(
                    format!("Invalid message at index {i}: {e}"),
                    Some(format!("messages[{i}]")),
                )
            })
        })
        .collect()
}
