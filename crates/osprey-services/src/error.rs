//! The one place an error becomes an HTTP response: [`ApiError`], in OpenAI's envelope.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use osprey_core::{Error, ErrorKind};

/// An [`Error`] on its way to the client.
#[derive(Debug)]
pub struct ApiError(pub Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        Self(e)
    }
}

/// The HTTP status of `kind`.
fn status(kind: ErrorKind) -> StatusCode {
    StatusCode::from_u16(kind.status_and_type().0).expect("a valid status")
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = status(self.0.kind);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            tracing::warn!(error = %self.0.message, "request turned away");
        } else if status.is_server_error() {
            tracing::error!(error = %self.0.message, "request failed");
        } else {
            tracing::debug!(status = status.as_u16(), error = %self.0.message, "request rejected");
        }
        let mut response = (status, axum::Json(self.0.envelope())).into_response();
        if let Some(secs) = self.0.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}
