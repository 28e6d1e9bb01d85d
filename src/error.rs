//! The one error type of the crate. Every failure a request can meet is a variant here;
//! `http::error` is the one place that turns it into a status code and an OpenAI-shaped body.

use std::time::Duration;

/// The request field the pipeline and the access checks name for the conversation; the
/// Responses route renames it with [`Error::with_conversation_param`].
pub const CONVERSATION_PARAM: &str = "messages";

/// Everything that can go wrong while serving a request or loading configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The client's request is malformed: not JSON, wrong types, a missing field.
    #[error("{message}")]
    InvalidRequest {
        message: String,
        /// The request field at fault, when one can be named.
        param: Option<String>,
    },
    /// The conversation is still larger than the model's context window after every rewrite.
    #[error(
        "This model's maximum context length is {window} tokens; the conversation needs {needed} tokens even after ctxproxy's rewrites"
    )]
    ContextLengthExceeded {
        window: u64,
        needed: u64,
        /// The request field holding the conversation: `messages` (chat) or `input` (Responses).
        param: &'static str,
        /// What the pipeline did before it gave up (SPEC 5.3: every request record stores the
        /// report, a refused one too); its token counts go back in the answer's headers.
        report: Box<crate::context::Report>,
    },
    /// No tenant accepts the presented key (or none was presented).
    #[error("Incorrect API key provided")]
    InvalidApiKey,
    /// Admin route called without the right admin token.
    #[error("admin token missing or wrong")]
    AdminUnauthorized,
    /// A route that does not exist (or is disabled, like the admin API without a token).
    #[error("{0}")]
    NotFound(String),
    /// A route that exists, called with a method it does not serve.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The role may not use a tool the request names.
    #[error("{message}")]
    ToolNotAllowed {
        message: String,
        param: Option<String>,
    },
    /// The role named by the key or header is not defined for the tenant.
    #[error("unknown role '{0}'")]
    UnknownRole(String),
    /// Request body larger than `server.max_body_bytes`.
    #[error("request body exceeds the limit of {limit} bytes")]
    RequestTooLarge { limit: usize },
    /// The upstream could not be reached (connect refused, DNS, TLS, reset before a response).
    #[error("upstream unreachable: {0}")]
    UpstreamUnreachable(String),
    /// The upstream answered a call of the proxy's own (a summary) with an error status. (A
    /// client's call relays the upstream's answer, whatever its status.)
    #[error("upstream answered {0}")]
    UpstreamRefused(String),
    /// The upstream did not answer (or stopped sending) within the configured time.
    #[error("upstream timed out after {0:?}")]
    UpstreamTimeout(Duration),
    /// No connection to the upstream within its tenant's `upstream.connect_timeout_s`: said
    /// apart from the whole request's limit, which is another setting.
    #[error("upstream timed out: no connection within upstream.connect_timeout_s")]
    UpstreamConnectTimeout,
    /// Another request on the session held it for longer than this one may wait (the
    /// tenant's `upstream.timeout_s`): the store is fine, the session is busy.
    #[error("session '{session}' is still busy with another request after {waited:?}; retry later")]
    SessionBusy { session: String, waited: Duration },
    /// The proxy is stopping and its grace period is over: the request was ended (its record
    /// and lease written and released) rather than dropped.
    #[error("ctxproxy is shutting down; retry the request")]
    ShuttingDown,
    /// The client went away before its request was forwarded (while it waited for its session):
    /// it is not sent upstream, where nobody would read the answer. Recorded as nginx's 499.
    #[error("the client closed the request before it was forwarded")]
    ClientClosed,
    /// The store failed; nothing is forwarded that could not be recorded.
    #[error("store unavailable: {0}")]
    StoreUnavailable(String),
    /// Configuration could not be loaded; the message names file and key path.
    #[error("{0}")]
    Config(String),
    /// A bug or an unexpected condition on our side.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// For an error about the conversation (a [`Error::ContextLengthExceeded`], or a
    /// [`Error::ToolNotAllowed`] for a call in it), names `field` as the request field holding
    /// the conversation instead of chat's `messages`; any other error is returned as it is.
    pub fn with_conversation_param(mut self, field: &'static str) -> Self {
        match &mut self {
            Error::ContextLengthExceeded { param, .. } => *param = field,
            Error::ToolNotAllowed {
                param: Some(param), ..
            } if param == CONVERSATION_PARAM => *param = field.to_string(),
            _ => {}
        }
        self
    }

    /// A 400 naming the offending field.
    pub fn invalid(message: impl Into<String>, param: impl Into<Option<String>>) -> Self {
        Error::InvalidRequest {
            message: message.into(),
            param: param.into(),
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        Error::StoreUnavailable(err.to_string())
    }
}

impl From<rusqlite::Error> for Error {
    fn from(err: rusqlite::Error) -> Self {
        Error::StoreUnavailable(err.to_string())
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        Error::StoreUnavailable(format!("migration failed: {err}"))
    }
}

/// Result with the crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
