//! Responses API input items as the pipeline's [`Message`]s, and back (SPEC 7). The pipeline
//! knows chat messages only; this module lets it rewrite Responses requests without knowing
//! items, and guarantees that whatever it leaves alone goes upstream exactly as received.
//!
//! The mapping:
//! - `message` items (and items with a `role` but no `type`) become a message of that role with
//!   the item's `content` (a string or `input_text`/`output_text` parts) as content.
//! - A run of consecutive `function_call` items becomes ONE assistant message with `tool_calls`
//!   (the call id is the item's `call_id`), as chat has it, so windows and repair count a
//!   parallel call turn the way they do for chat. A `custom_tool_call` (a custom tool's free-text
//!   call) is a call like any other, as chat's custom calls are: filters, windows, the role's
//!   scrub and repair treat it by its `name`.
//! - `function_call_output` (or `custom_tool_call_output`) becomes a `tool` message answering
//!   `call_id`.
//! - `reasoning` items travel with the item that follows them: inside a run of calls they lead
//!   the calls after them up to the next reasoning, and are dropped with them (see [`emit`]).
//!   Reasoning followed by nothing of its reply (a reply that is reasoning alone, then the next
//!   user message; the end of the input) stands alone as an `item:reasoning` message, which
//!   repair drops as an empty assistant turn: the provider refuses it (SPEC 5 step 7).
//! - Every other item (`web_search_call`, `item_reference`, types not yet invented, …) becomes an
//!   opaque message with role `item:<type>` and no content: no step removes or changes such a
//!   message except the token budget, which drops old history whole turns at a time.
//! - `instructions` becomes a leading `system` message, so it is counted and always kept; it is
//!   never emitted as an item (the request's field is left as it is).
//!
//! Each message keeps the items it came from under [`ORIGINAL_KEY`] in `extra`, which is how
//! [`to_items`] re-emits untouched items byte-for-value and edits only what a step changed.

mod emit;
mod reasoning;

use std::ops::Range;

use serde_json::{Value, json};

use crate::context::{
    CallChange, Change, PipelineInput, Policy, RemoveReason, Removed, RepairKind, Repaired, Report,
};
use crate::conversation::{ITEM_ROLE_PREFIX, Message, MessageId, Role, ToolCall, message_id};
use crate::tokens::ModelFacts;

pub use emit::to_items;
use reasoning::keep_reasoning_of_sent_items;

/// The private `extra` key holding the original items of a message, in order.
pub const ORIGINAL_KEY: &str = "__ctxproxy_items";
/// The private `extra` key marking the message made from `instructions`.
pub const INSTRUCTIONS_KEY: &str = "__ctxproxy_instructions";
/// The private `extra` key of a call-turn message's tool call holding the position of its
/// `function_call` item among the message's items. `call_id`s may repeat within a turn, so this
/// is how [`to_items`] knows which items are the calls the pipeline kept.
pub(crate) const CALL_ITEM_KEY: &str = "__ctxproxy_item";

/// What an input item is, as far as the mapping cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Message,
    Call,
    Output,
    Reasoning,
    Opaque,
}

/// The roles a Responses `message` item may have.
const MESSAGE_ROLES: [&str; 4] = ["user", "assistant", "system", "developer"];

/// The kind of one wire item. Calls and outputs without a string `call_id`, and messages
/// without one of the API's roles (a chat `tool` message sent here is not a tool result), are
/// opaque: the upstream will judge them, the pipeline cannot.
pub(crate) fn kind(item: &Value) -> Kind {
    let has = |key: &str| item.get(key).is_some_and(Value::is_string);
    let role = item.get("role").and_then(Value::as_str);
    match item.get("type").and_then(Value::as_str) {
        Some("message") | None if role.is_some_and(|r| MESSAGE_ROLES.contains(&r)) => Kind::Message,
        Some("function_call" | "custom_tool_call") if has("call_id") => Kind::Call,
        Some("function_call_output" | "custom_tool_call_output") if has("call_id") => Kind::Output,
        Some("reasoning") => Kind::Reasoning,
        // A reference to a stored reasoning item (OpenAI's reasoning ids begin `rs_`) is
        // reasoning like the item itself: it leads the calls after it and goes with them.
        _ if is_item_reference(item)
            && item
                .get("id")
                .and_then(Value::as_str)
                .is_some_and(|id| id.starts_with("rs_")) =>
        {
            Kind::Reasoning
        }
        _ => Kind::Opaque,
    }
}

/// An `item_reference` (typed, or the short form: an `id` alone, with neither type nor role).
pub(crate) fn is_item_reference(item: &Value) -> bool {
    match item.get("type").and_then(Value::as_str) {
        Some(t) => t == "item_reference",
        None => item.get("role").is_none() && item.get("id").is_some_and(Value::is_string),
    }
}

/// The kind of each of `items`, in its place. An output whose call is not among the items but
/// may be an `item_reference` before it (a client that sends stored calls by reference, as the
/// Vercel AI SDK does) is opaque: the proxy cannot see its call, so no step may take it for an
/// orphan and drop it; the upstream, which holds the call, judges it.
fn kinds_in_place(items: &[Value]) -> Vec<Kind> {
    let mut kinds: Vec<Kind> = items.iter().map(kind).collect();
    let Some(first_reference) = items
        .iter()
        .zip(&kinds)
        .position(|(item, k)| *k == Kind::Opaque && is_item_reference(item))
    else {
        return kinds;
    };
    let called: std::collections::HashSet<&str> = items
        .iter()
        .zip(&kinds)
        .filter(|(_, k)| **k == Kind::Call)
        .filter_map(|(item, _)| item.get("call_id").and_then(Value::as_str))
        .collect();
    // The first output for such a call only: a second answers it again, which repair drops
    // (as an orphan, since the proxy cannot see the call it duplicates).
    let mut answered: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (item, k) in items.iter().zip(kinds.iter_mut()).skip(first_reference) {
        let call_id = item.get("call_id").and_then(Value::as_str);
        if *k == Kind::Output
            && let Some(call_id) = call_id.filter(|c| !called.contains(c))
            && answered.insert(call_id)
        {
            *k = Kind::Opaque;
        }
    }
    kinds
}

/// A Responses conversation as pipeline messages.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemMessages {
    /// The messages, `instructions` first when given.
    pub messages: Vec<Message>,
    /// For each message, its main item (a call turn: its first call; otherwise the item after
    /// the reasoning that leads it); `None` for the instructions.
    pub item_index: Vec<Option<usize>>,
    /// For each message, the items it carries, leading reasoning included; the last one's
    /// chained id names the message. `None` for the instructions.
    ranges: Vec<Option<Range<usize>>>,
    /// The kind of each item.
    kinds: Vec<Kind>,
}

impl ItemMessages {
    /// Maps `instructions` and `items` to messages.
    pub fn new(instructions: Option<&Value>, items: &[Value]) -> ItemMessages {
        let mut out = ItemMessages {
            messages: Vec::with_capacity(items.len() + 1),
            item_index: Vec::with_capacity(items.len() + 1),
            ranges: Vec::with_capacity(items.len() + 1),
            kinds: kinds_in_place(items),
        };
        if let Some(text) = instructions.filter(|v| !v.is_null()) {
            let content = match text {
                Value::String(_) => text.clone(),
                other => Value::String(other.to_string()),
            };
            let mut m = Message::text(Role::System, "");
            m.content = Some(content);
            m.extra.insert(INSTRUCTIONS_KEY.into(), Value::Bool(true));
            out.push(m, None, None);
        }
        let kinds = std::mem::take(&mut out.kinds);
        let mut i = 0;
        while i < items.len() {
            // Reasoning items lead the item of their reply that follows them; reasoning followed
            // by nothing it can lead (the end, the client's next message) stands alone, each
            // item a message of its own, which repair drops.
            let mut start = i;
            while i < items.len() && kinds[i] == Kind::Reasoning {
                i += 1;
            }
            if i == items.len() || !reasoning_leads(kinds[i], &items[i]) {
                for k in start..i {
                    out.push(opaque(&items[k..=k]), Some(k), Some(k..k + 1));
                }
                if i == items.len() {
                    break;
                }
                start = i;
            }
            match kinds[i] {
                Kind::Call => {
                    let first_call = i;
                    let end = call_run_end(&kinds, i);
                    out.push(
                        call_turn(&items[start..end]),
                        Some(first_call),
                        Some(start..end),
                    );
                    i = end;
                }
                Kind::Output => {
                    out.push(output(&items[start..=i]), Some(i), Some(start..i + 1));
                    i += 1;
                }
                Kind::Message => {
                    out.push(message(&items[start..=i]), Some(i), Some(start..i + 1));
                    i += 1;
                }
                Kind::Reasoning | Kind::Opaque => {
                    out.push(opaque(&items[start..=i]), Some(i), Some(start..i + 1));
                    i += 1;
                }
            }
        }
        out.kinds = kinds;
        out
    }

    fn push(&mut self, m: Message, index: Option<usize>, range: Option<Range<usize>>) {
        self.messages.push(m);
        self.item_index.push(index);
        self.ranges.push(range);
    }

    /// The pipeline's input for these messages, counted the way Responses sends them (see
    /// [`PipelineInput::text_apart_from_calls`]); set the other fields as needed.
    pub fn pipeline_input<'a>(
        &'a self,
        policy: &'a Policy,
        model: ModelFacts,
    ) -> PipelineInput<'a> {
        PipelineInput {
            text_apart_from_calls: true,
            ..PipelineInput::new(&self.messages, policy, model)
        }
    }

    /// Ids for the token cache, parallel to `messages`, from the chained ids of the items
    /// (`item_ids` parallel to the items). A message is named by the id of its last item: that
    /// id names the whole prefix, so it determines the message. `None` if the lengths differ.
    pub fn ids(&self, item_ids: &[MessageId]) -> Option<Vec<MessageId>> {
        if item_ids.len() != self.kinds.len() {
            return None;
        }
        self.messages
            .iter()
            .zip(&self.ranges)
            .map(|(m, range)| match range {
                Some(r) => item_ids.get(r.end.checked_sub(1)?).copied(),
                None => Some(message_id(
                    None,
                    &json!({"role": m.role.as_str(), "content": m.content}),
                )),
            })
            .collect()
    }

    /// The pipeline's report (and its `calls`, see [`CallChange`]) in terms of the items the
    /// conversation was made from, which is what a Responses client sent: every item that is
    /// not sent is named once, by its own index, in `removed` (or, when repair dropped it, in
    /// `repaired`), and every repair and compression names the item it concerns. The
    /// instructions are never removed or repaired.
    ///
    /// An item's `role` in `removed` is that of the message it maps to: `assistant` for
    /// `function_call` and `reasoning`, `tool` for `function_call_output`, the item's own role
    /// for a message, `item:<type>` for other items.
    pub fn report_in_items(&self, mut report: Report, calls: &[CallChange]) -> Report {
        let mut fate: Vec<Option<Fate>> = vec![None; self.kinds.len()];
        let mut repaired: Vec<Repaired> = Vec::new();
        // Calls first: a call leaves its turn before the turn itself can go.
        let mut turns: Vec<Range<usize>> = Vec::new();
        for c in calls {
            let Some((k, turn)) = self.call_item(c.index, c.call) else {
                continue;
            };
            if turns.last() != Some(&turn) {
                turns.push(turn);
            }
            match c.change {
                Change::Removed(reason) => {
                    fate[k].get_or_insert(Fate::Removed(reason));
                }
                Change::Repaired { kind, dropped } => {
                    repaired.push(Repaired { index: k, kind });
                    if dropped {
                        fate[k].get_or_insert(Fate::Repaired(kind));
                    }
                }
            }
        }
        // Reasoning leads the calls after it up to the next reasoning (see `emit`): it is sent
        // while one of them is, else it goes with the call that follows it.
        for turn in turns {
            let mut kept_after = false;
            let mut next: Option<Fate> = None;
            let mut after_reasoning = false;
            for k in turn.rev() {
                match self.kinds[k] {
                    Kind::Call => {
                        if after_reasoning {
                            // The calls after this reasoning were another's group.
                            kept_after = false;
                            after_reasoning = false;
                        }
                        kept_after |= fate[k].is_none();
                        next = fate[k];
                    }
                    Kind::Reasoning => {
                        after_reasoning = true;
                        if !kept_after && fate[k].is_none() {
                            fate[k] = next;
                            if let Some(Fate::Repaired(kind)) = next {
                                repaired.push(Repaired { index: k, kind });
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        // Whole messages: every item of theirs still there goes with them.
        for r in &report.removed {
            for k in self.range(r.index) {
                fate[k].get_or_insert(Fate::Removed(r.reason));
            }
        }
        for r in &report.repaired {
            let on_result = self
                .messages
                .get(r.index)
                .is_some_and(|m| m.role == Role::Tool);
            match r.kind {
                // Named by the call, above.
                RepairKind::UnansweredCall => {}
                RepairKind::DuplicateId if !on_result => {}
                RepairKind::MovedResult => {
                    if let Some(index) = self.main_item(r.index) {
                        repaired.push(Repaired {
                            index,
                            kind: r.kind,
                        });
                    }
                }
                kind => {
                    for k in self.range(r.index) {
                        if fate[k].is_none() {
                            fate[k] = Some(Fate::Repaired(kind));
                            repaired.push(Repaired { index: k, kind });
                        }
                    }
                }
            }
        }
        report
            .compressed
            .retain_mut(|c| match self.main_item(c.index) {
                Some(i) => {
                    c.index = i;
                    true
                }
                None => false,
            });
        report.removed = self
            .ranges
            .iter()
            .zip(&self.messages)
            .filter_map(|(range, m)| Some((range.clone()?, m)))
            .flat_map(|(range, m)| range.map(move |k| (k, m)))
            .filter_map(|(k, m)| match fate[k] {
                Some(Fate::Removed(reason)) => Some(Removed {
                    index: k,
                    role: match self.kinds[k] {
                        Kind::Call | Kind::Reasoning => Role::Assistant,
                        Kind::Output => Role::Tool,
                        Kind::Message | Kind::Opaque => m.role.clone(),
                    },
                    reason,
                }),
                _ => None,
            })
            .collect();
        repaired.sort_by_key(|r| r.index);
        report.repaired = repaired;
        report
    }

    /// The items of message `index` (none for the instructions or an index out of range).
    fn range(&self, index: usize) -> Range<usize> {
        self.ranges.get(index).cloned().flatten().unwrap_or(0..0)
    }

    /// The main item of message `index`.
    fn main_item(&self, index: usize) -> Option<usize> {
        self.item_index.get(index).copied().flatten()
    }

    /// The item of call `call` of message `index` (a call turn), with the turn's items.
    fn call_item(&self, index: usize, call: usize) -> Option<(usize, Range<usize>)> {
        let turn = self.range(index);
        let k = turn
            .clone()
            .filter(|&k| self.kinds[k] == Kind::Call)
            .nth(call)?;
        Some((k, turn))
    }
}

/// What became of an item that is not sent.
#[derive(Debug, Clone, Copy)]
enum Fate {
    Removed(RemoveReason),
    Repaired(RepairKind),
}

/// A string field of the item a message of an item the pipeline does not model
/// (`item:<type>`) was made from: `call_id`, `id`, `approval_request_id`. `None` for other
/// messages.
pub fn item_field<'m>(m: &'m Message, key: &str) -> Option<&'m str> {
    m.extra
        .get(ORIGINAL_KEY)?
        .as_array()?
        .last()?
        .get(key)?
        .as_str()
}

fn with_originals(mut m: Message, items: &[Value]) -> Message {
    m.extra
        .insert(ORIGINAL_KEY.into(), Value::Array(items.to_vec()));
    m
}

/// The items to send for the rewritten `messages` ([`to_items`]) with the reasoning of
/// every reply item sent ([`keep_reasoning_of_sent_items`]), and `report` (in items, see
/// [`ItemMessages::report_in_items`]) told so: a reasoning item put back is not removed. Its
/// tokens are those of the item it leads, as the pipeline counts a reasoning item that leads
/// one (nothing of its own).
pub fn items_to_send<'m>(
    input: &[Value],
    messages: impl IntoIterator<Item = &'m Message>,
    report: &mut Report,
) -> Vec<Value> {
    let mut items = to_items(messages);
    let restored = keep_reasoning_of_sent_items(input, &mut items);
    if !restored.is_empty() {
        report
            .removed
            .retain(|r| restored.binary_search(&r.index).is_err());
        report
            .repaired
            .retain(|r| restored.binary_search(&r.index).is_err());
    }
    items
}

/// Whether a reasoning item can lead `item` (of kind `kind`): only an item the model produced
/// in the same reply, which is what the provider wants after a reasoning item (it refuses one
/// "provided without its required following item"): a call, an assistant message, another
/// output item (a built-in tool's call, an item reference, a type not yet invented). Not what a
/// client adds after a reply: a message of another role, a tool's output
/// (`function_call_output`, `computer_call_output`, …), an MCP approval response. A reply that
/// is reasoning alone (a reasoning model cut off by `max_output_tokens`) is followed by such.
fn reasoning_leads(kind: Kind, item: &Value) -> bool {
    match kind {
        Kind::Call | Kind::Reasoning => true,
        Kind::Message => item.get("role").and_then(Value::as_str) == Some("assistant"),
        Kind::Output => false,
        Kind::Opaque => match item.get("type").and_then(Value::as_str) {
            // A message with a role outside the API (a chat `tool` message) is no output.
            None | Some("message") => false,
            Some(t) => !t.ends_with("_output") && t != "mcp_approval_response",
        },
    }
}

/// Whether `m` is a reasoning item that leads nothing (see [`ItemMessages::new`]): the
/// provider refuses it, and repair drops it.
/// A reference to a reasoning item standing alone is one too.
pub fn is_lone_reasoning(m: &Message) -> bool {
    matches!(&m.role, Role::Other(r) if r.starts_with(ITEM_ROLE_PREFIX))
        && m.extra
            .get(ORIGINAL_KEY)
            .and_then(Value::as_array)
            .is_some_and(
                |items| matches!(items.as_slice(), [item] if kind(item) == Kind::Reasoning),
            )
}

/// Where a run of calls starting at `i` ends: calls, and reasoning that leads a further call.
fn call_run_end(kinds: &[Kind], mut i: usize) -> usize {
    while i < kinds.len() {
        match kinds[i] {
            Kind::Call => i += 1,
            Kind::Reasoning => {
                let mut k = i;
                while k < kinds.len() && kinds[k] == Kind::Reasoning {
                    k += 1;
                }
                if k < kinds.len() && kinds[k] == Kind::Call {
                    i = k;
                } else {
                    break;
                }
            }
            _ => break,
        }
    }
    i
}

/// Whether a call or output item is a custom tool's (`custom_tool_call[_output]`).
pub(crate) fn is_custom(item: &Value) -> bool {
    item.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t.starts_with("custom_tool_call"))
}

fn str_field(item: &Value, key: &str) -> String {
    item.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// One assistant turn of calls (with the reasoning items among them).
fn call_turn(items: &[Value]) -> Message {
    let calls = items
        .iter()
        .enumerate()
        .filter(|(_, it)| kind(it) == Kind::Call)
        .map(|(k, it)| {
            let (id, name) = (str_field(it, "call_id"), str_field(it, "name"));
            let mut call = if is_custom(it) {
                ToolCall::custom(id, name, str_field(it, "input"))
            } else {
                ToolCall::function(id, name, str_field(it, "arguments"))
            };
            call.extra.insert(CALL_ITEM_KEY.to_string(), Value::from(k));
            call
        })
        .collect();
    let mut m = Message::text(Role::Assistant, "");
    m.content = None;
    m.tool_calls = Some(Some(calls));
    with_originals(m, items)
}

/// A `function_call_output` (last of `items`) as a tool result.
fn output(items: &[Value]) -> Message {
    let main = items.last().unwrap_or(&Value::Null);
    let mut m = Message::text(Role::Tool, "");
    m.content = main.get("output").cloned();
    m.tool_call_id = Some(str_field(main, "call_id"));
    with_originals(m, items)
}

/// A `message` item (last of `items`).
fn message(items: &[Value]) -> Message {
    let main = items.last().unwrap_or(&Value::Null);
    let mut m = Message::text(Role::from(str_field(main, "role").as_str()), "");
    m.content = main.get("content").cloned();
    with_originals(m, items)
}

/// An item the pipeline does not understand (last of `items`).
fn opaque(items: &[Value]) -> Message {
    let main = items.last().unwrap_or(&Value::Null);
    let kind = main
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let mut m = Message::text(Role::Other(format!("{ITEM_ROLE_PREFIX}{kind}")), "");
    if kind != "reasoning" {
        m.content = ItemContent::of(main).into_content();
    }
    with_originals(m, items)
}

/// What an item the proxy does not model sends the model (a `web_search_call`'s query, an
/// `mcp_call`'s arguments and output, a `file_search_call`'s results, a `computer_call_output`'s
/// screenshot), as the content of its message: so that it is counted in the tokens (SPEC 5.1),
/// the budget and the context window check see it, and a summary reads it. The item itself is
/// always sent as received: this content is never emitted. A trailing `reasoning` item has none,
/// as OpenAI does not send earlier turns' reasoning to the model.
#[derive(Default)]
struct ItemContent {
    /// Every string at any depth but names and markers (`id`, `type`, `status`, `call_id`) and
    /// `encrypted_content` (opaque to the model's input), one per line.
    text: String,
    /// Images and files (a part of such a type, an `image_url` or `file_data`, a data URL, an
    /// image generation's `result`): each costs the flat price of a non-text part, as SPEC 5.1
    /// prices them, never its base64 as text.
    media: usize,
}

impl ItemContent {
    fn of(item: &Value) -> ItemContent {
        let mut out = ItemContent::default();
        out.walk(item);
        out
    }

    fn walk(&mut self, v: &Value) {
        match v {
            Value::String(s) if is_base64_data_url(s) => self.media += 1,
            Value::String(s) => {
                if !self.text.is_empty() {
                    self.text.push('\n');
                }
                self.text.push_str(s);
            }
            Value::Array(items) => items.iter().for_each(|i| self.walk(i)),
            Value::Object(fields) => {
                let kind = fields.get("type").and_then(Value::as_str);
                if kind.is_some_and(is_media_part) {
                    self.media += 1;
                    return;
                }
                for (key, v) in fields {
                    match key.as_str() {
                        "id" | "type" | "status" | "call_id" | "encrypted_content" => {}
                        "image_url" | "file_data" if v.is_string() || v.is_object() => {
                            self.media += 1
                        }
                        "result" if kind == Some("image_generation_call") => self.media += 1,
                        _ => self.walk(v),
                    }
                }
            }
            _ => {}
        }
    }

    /// The message content: the text alone, or (with media) a text part and one part per
    /// medium, which the counter prices as non-text parts.
    fn into_content(self) -> Option<Value> {
        match (self.text.is_empty(), self.media) {
            (true, 0) => None,
            (false, 0) => Some(Value::String(self.text)),
            (_, media) => {
                let text = (!self.text.is_empty())
                    .then(|| json!({"type": "input_text", "text": self.text}));
                let parts = text
                    .into_iter()
                    .chain(std::iter::repeat_n(json!({"type": "input_image"}), media));
                Some(Value::Array(parts.collect()))
            }
        }
    }
}

/// A `data:<type>/<subtype>[;…];base64,` URL (an image or file inline), not text that merely
/// begins with `data:` (an event log, `data: GDP 2024`).
fn is_base64_data_url(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("data:") else {
        return false;
    };
    let Some((header, _)) = rest.split_once(',') else {
        return false;
    };
    let mime = header.split(';').next().unwrap_or_default();
    header.ends_with(";base64")
        && mime.split_once('/').is_some_and(|(kind, sub)| {
            !kind.is_empty() && !sub.is_empty() && !mime.contains(char::is_whitespace)
        })
}

/// Content part types that are not text.
fn is_media_part(kind: &str) -> bool {
    matches!(
        kind,
        "input_image" | "input_file" | "input_audio" | "computer_screenshot" | "image_url"
    )
}
