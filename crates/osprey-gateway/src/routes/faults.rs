//! Fault injection for the reliability suites (`osprey serve --fault-injection`; off by
//! default, behind the admin key): `POST /admin/faults/panic` panics inside its handler, so
//! `reliability/chaos.sh` can check that a panic costs its one request a clean 500 envelope
//! and the server nothing.

use axum::Router;
use axum::routing::post;

use osprey_services::state::Services;

/// The fault-injection routes.
pub fn routes() -> Router<Services> {
    Router::new().route("/admin/faults/panic", post(panic_in_handler))
}

async fn panic_in_handler() -> &'static str {
    panic!("fault injected by POST /admin/faults/panic")
}
