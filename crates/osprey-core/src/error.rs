//! The error contract shared by all crates.

/// What kind of failure occurred; the gateway maps each kind to one HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or asks for something impossible (400).
    InvalidRequest,
    /// The request body is larger than the server accepts (413).
    PayloadTooLarge,
    /// The named model, or another resource, does not exist (404).
    NotFound,
    /// No or wrong credentials (401).
    Unauthorized,
    /// The caller may not do this (403).
    Forbidden,
    /// The caller is over a rate limit (429).
    RateLimited,
    /// The server is at capacity or not ready; retry later (503).
    Unavailable,
    /// A bug or an unexpected failure inside the server (500).
    Internal,
    /// An upstream server failed or could not be reached (502).
    BadGateway,
    /// An upstream server did not answer in time (504).
    GatewayTimeout,
}

impl ErrorKind {
    /// The kind an HTTP `status` stands for (an unknown 4xx is the request's fault, an unknown
    /// 5xx the server's).
    pub fn of_status(status: u16) -> Self {
        match status {
            401 => Self::Unauthorized,
            403 => Self::Forbidden,
            404 => Self::NotFound,
            413 => Self::PayloadTooLarge,
            429 => Self::RateLimited,
            502 => Self::BadGateway,
            503 => Self::Unavailable,
            504 => Self::GatewayTimeout,
            400..500 => Self::InvalidRequest,
            _ => Self::Internal,
        }
    }

    /// The kind an OpenAI error `type` stands for, as told in a stream (no status there).
    pub fn of_type(kind: &str) -> Self {
        match kind {
            "invalid_request_error" => Self::InvalidRequest,
            "authentication_error" => Self::Unauthorized,
            "permission_error" => Self::Forbidden,
            "rate_limit_error" => Self::RateLimited,
            _ => Self::Internal,
        }
    }

    /// The HTTP status and OpenAI error `type` of this kind.
    pub fn status_and_type(self) -> (u16, &'static str) {
        match self {
            Self::InvalidRequest => (400, "invalid_request_error"),
            Self::PayloadTooLarge => (413, "invalid_request_error"),
            Self::NotFound => (404, "invalid_request_error"),
            Self::Unauthorized => (401, "authentication_error"),
            Self::Forbidden => (403, "permission_error"),
            Self::RateLimited => (429, "rate_limit_error"),
            Self::Unavailable => (503, "server_error"),
            Self::Internal => (500, "server_error"),
            Self::BadGateway => (502, "server_error"),
            Self::GatewayTimeout => (504, "server_error"),
        }
    }
}

/// A failure with a message for the caller, in OpenAI's terms.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    /// The kind, which decides the HTTP status.
    pub kind: ErrorKind,
    /// A message a person understands.
    pub message: String,
    /// The request field at fault, if one is (`"messages"`, `"max_tokens"`…).
    pub param: Option<String>,
    /// A stable machine-readable code (`"model_not_found"`, `"context_length_exceeded"`…).
    pub code: Option<String>,
    /// Seconds after which a retry may succeed (sent as `retry-after`).
    pub retry_after: Option<u64>,
}

impl Error {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// The error as OpenAI's envelope, `{"error": {...}}`.
    pub fn envelope(&self) -> crate::api::ErrorResponse {
        crate::api::ErrorResponse {
            error: crate::api::ErrorBody {
                message: self.message.clone(),
                kind: self.kind.status_and_type().1.to_owned(),
                param: self.param.clone(),
                code: self.code.clone(),
            },
        }
    }

    /// The error another OpenAI-compatible server (an `osprey worker`) told in its envelope:
    /// its message, param and code kept, of `kind`.
    pub fn told(kind: ErrorKind, told: crate::api::ErrorBody) -> Self {
        Self {
            kind,
            message: told.message,
            param: told.param,
            code: told.code,
            retry_after: None,
        }
    }

    /// A 400 about field `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message).with_param(param)
    }

    /// An internal error.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// The 404 for a model the server does not serve.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            ErrorKind::NotFound,
            format!(
                "The model `{model}` does not exist. GET /v1/models lists the models served here."
            ),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// Names the request field at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Suggests retrying after `seconds`.
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }
}

/// Result alias using [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
