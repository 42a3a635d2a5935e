//! The JSON body extractor and the middleware that keep every rejection in OpenAI's envelope
//! (an error becomes a response in one place, [`osprey_services::error::ApiError`]).

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use osprey_core::{Error, ErrorKind};
use osprey_services::error::ApiError;

/// A JSON request body parsed into `T`, with every failure (too large, unreadable, not JSON,
/// wrong shape) reported in OpenAI's envelope with the offending field named.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: osprey_core::api::ApiRequest> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(body_error)?;
        Ok(Self(osprey_core::api::parse_request(&bytes)?))
    }
}

/// A request body that could not be read: 413 when it is over the body limit, else a 400.
pub fn body_error(rejection: axum::extract::rejection::BytesRejection) -> Error {
    unreadable(rejection.status(), "body", "request body", &rejection)
}

/// A multipart form that could not be read: 413 when it is over the body limit, else a 400
/// naming `field`.
pub fn form_error(field: &str, e: axum::extract::multipart::MultipartError) -> Error {
    unreadable(e.status(), field, "upload", e.body_text())
}

/// The `what` of a request could not be read, as `status` says: too large (413), or else
/// unreadable (400, naming `field`).
fn unreadable(status: StatusCode, field: &str, what: &str, why: impl std::fmt::Display) -> Error {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        Error::new(
            ErrorKind::PayloadTooLarge,
            format!("The {what} is larger than this server accepts."),
        )
    } else {
        Error::invalid(field, format!("The {what} could not be read: {why}"))
    }
}

/// The response for routes that do not exist.
pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError(Error::new(
        ErrorKind::NotFound,
        format!("There is no route {}.", uri.path()),
    ))
}

/// Puts an error answered outside [`ApiError`] into OpenAI's envelope, keeping its status:
/// axum's own rejections (a path segment or query string that does not parse, a body over the
/// limit, a malformed multipart form) answer in plain text, and an upstream's error page may
/// be anything. Every error a client sees is the envelope, whoever produced it.
pub async fn enveloped(req: Request, next: axum::middleware::Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    let json = (response.headers().get(axum::http::header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return response;
    }
    let retry_after = response
        .headers()
        .get(axum::http::header::RETRY_AFTER)
        .cloned();
    let text = axum::body::to_bytes(response.into_body(), 64 << 10)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let message = match text.trim() {
        "" => status.canonical_reason().unwrap_or("failed").to_owned(),
        text => text.chars().take(1000).collect(),
    };
    let mut enveloped = ApiError(Error::new(kind_of(status), message)).into_response();
    *enveloped.status_mut() = status;
    if let Some(v) = retry_after {
        enveloped
            .headers_mut()
            .insert(axum::http::header::RETRY_AFTER, v);
    }
    enveloped
}

/// The error kind closest to an HTTP error status, for the envelope's `type`.
fn kind_of(status: StatusCode) -> ErrorKind {
    match status {
        StatusCode::UNAUTHORIZED => ErrorKind::Unauthorized,
        StatusCode::FORBIDDEN => ErrorKind::Forbidden,
        StatusCode::NOT_FOUND => ErrorKind::NotFound,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorKind::PayloadTooLarge,
        StatusCode::TOO_MANY_REQUESTS => ErrorKind::RateLimited,
        StatusCode::BAD_GATEWAY => ErrorKind::BadGateway,
        StatusCode::SERVICE_UNAVAILABLE => ErrorKind::Unavailable,
        StatusCode::GATEWAY_TIMEOUT => ErrorKind::GatewayTimeout,
        s if s.is_client_error() => ErrorKind::InvalidRequest,
        _ => ErrorKind::Internal,
    }
}

/// The response when a handler panics: the request fails, the server does not.
pub fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError(Error::internal(
        "The server hit an internal error while handling this request.",
    ))
    .into_response()
}
