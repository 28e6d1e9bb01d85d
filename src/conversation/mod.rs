//! The conversation model shared by both managed APIs. Chat messages are the model; the
//! Responses API converts its items into it and back. Every wire field we do not read is kept
//! in `extra` maps so that an untouched message is re-emitted as received.

pub mod chat;
pub mod dumps;
pub mod identity;
pub mod message;
pub mod messages;
pub mod responses;
pub mod responses_items;

pub use chat::ChatRequest;
pub use identity::{MessageId, chain_ids, message_id};
pub use message::{CustomCall, FunctionCall, ITEM_ROLE_PREFIX, Message, Role, ToolCall};
pub use messages::Messages;
pub use responses::ResponsesRequest;
pub use responses_items::ItemMessages;
