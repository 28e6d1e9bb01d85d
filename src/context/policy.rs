//! The rewrite policy: which pipeline steps run and with what limits. A tenant's `policy` is
//! merged over the server's `defaults` step by step (a step the tenant names replaces the
//! default's step whole).

use serde::Deserialize;

/// Every step of SPEC section 5 that a tenant can configure. A missing step is off, except
/// repair, which always runs (with `unanswered_calls: drop` unless configured).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default)]
    pub tool_filter: Option<ToolFilter>,
    #[serde(default)]
    pub tool_call_window: Option<ToolCallWindow>,
    #[serde(default)]
    pub compress_tool_output: Option<CompressToolOutput>,
    #[serde(default)]
    pub summary: Option<SummaryPolicy>,
    #[serde(default)]
    pub token_budget: Option<TokenBudget>,
    #[serde(default)]
    pub repair: Option<Repair>,
}

impl Policy {
    /// This policy with every step it leaves unset taken from `defaults`.
    pub fn merged_over(&self, defaults: &Policy) -> Policy {
        Policy {
            tool_filter: self
                .tool_filter
                .clone()
                .or_else(|| defaults.tool_filter.clone()),
            tool_call_window: self.tool_call_window.or(defaults.tool_call_window),
            compress_tool_output: self.compress_tool_output.or(defaults.compress_tool_output),
            summary: self.summary.clone().or_else(|| defaults.summary.clone()),
            token_budget: self.token_budget.or(defaults.token_budget),
            repair: self.repair.or(defaults.repair),
        }
    }

    /// Feeds every setting into `h`, for telling policies apart in a memo key (see
    /// `settled.rs`). Each struct is taken apart whole, so that a new setting cannot be
    /// forgotten here.
    pub fn fingerprint(&self, h: &mut impl std::hash::Hasher) {
        use std::hash::Hash;
        let Policy {
            tool_filter,
            tool_call_window,
            compress_tool_output,
            summary,
            token_budget,
            repair,
        } = self;
        if let Some(ToolFilter {
            exclude,
            include,
            placeholder,
        }) = tool_filter
        {
            (1u8, exclude, include, placeholder).hash(h);
        }
        if let Some(ToolCallWindow { max, unit }) = tool_call_window {
            (2u8, max, *unit == WindowUnit::Turn).hash(h);
        }
        if let Some(CompressToolOutput { max_tokens }) = compress_tool_output {
            (3u8, max_tokens).hash(h);
        }
        if let Some(SummaryPolicy {
            model,
            trigger_tokens,
            target_tokens,
            min_messages,
            blocking,
            prompt,
        }) = summary
        {
            (
                4u8,
                model,
                trigger_tokens,
                target_tokens,
                min_messages,
                blocking,
                prompt,
            )
                .hash(h);
        }
        if let Some(TokenBudget {
            max_tokens,
            target_ratio,
        }) = token_budget
        {
            (5u8, max_tokens, target_ratio.map(f64::to_bits)).hash(h);
        }
        if let Some(Repair { unanswered_calls }) = repair {
            (6u8, *unanswered_calls == UnansweredCalls::Placeholder).hash(h);
        }
    }

    /// Repair settings in force (repair always runs).
    pub fn repair(&self) -> Repair {
        self.repair.unwrap_or_default()
    }
}

/// Step 2: remove history tool calls by function name.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolFilter {
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// Leave `[tool call omitted: NAME]` in the assistant message for each removed call.
    #[serde(default)]
    pub placeholder: bool,
}

/// Step 3: keep only the N most recent history tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallWindow {
    pub max: usize,
    #[serde(default)]
    pub unit: WindowUnit,
}

/// What one unit of the tool-call window is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowUnit {
    /// Each tool result counts one (parallel calls count separately).
    #[default]
    Call,
    /// Each assistant message with tool calls counts one.
    Turn,
}

/// Step 4: shorten history tool results over `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressToolOutput {
    pub max_tokens: u64,
}

/// Step 5: replace older history by a stored rolling summary.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummaryPolicy {
    pub model: String,
    #[serde(default = "default_trigger_tokens")]
    pub trigger_tokens: u64,
    #[serde(default = "default_target_tokens")]
    pub target_tokens: u64,
    #[serde(default = "default_min_messages")]
    pub min_messages: usize,
    #[serde(default)]
    pub blocking: bool,
    /// The instruction given to the summariser; a sensible one is built in.
    #[serde(default)]
    pub prompt: Option<String>,
}

fn default_trigger_tokens() -> u64 {
    50_000
}
fn default_target_tokens() -> u64 {
    30_000
}
fn default_min_messages() -> usize {
    20
}

/// Step 6: keep the history that fits a token budget.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBudget {
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// A fraction of the model's context window.
    #[serde(default)]
    pub target_ratio: Option<f64>,
}

impl TokenBudget {
    /// The budget in tokens for a model with `context_window` tokens.
    pub fn limit(&self, context_window: u64) -> u64 {
        match (self.max_tokens, self.target_ratio) {
            (Some(max), _) => max,
            (None, Some(ratio)) => (context_window as f64 * ratio).floor() as u64,
            (None, None) => context_window,
        }
    }
}

/// Step 7: make the request one the provider accepts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Repair {
    #[serde(default)]
    pub unanswered_calls: UnansweredCalls,
}

/// What repair does with a tool call nobody answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnansweredCalls {
    #[default]
    Drop,
    Placeholder,
}
