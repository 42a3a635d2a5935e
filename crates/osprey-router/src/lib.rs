//! The router decides which backend serves a request and what happens when one fails.
//!
//! This crate grows with issue [4/13]; today it holds the reliability controls every pool
//! needs, as plain state machines with time passed in, so they can be tested without sleeping
//! and shared by every backend kind (local engine, workers, upstreams):
//! - [`breaker::CircuitBreaker`]: stops sending to a backend that keeps failing, probes it
//!   again after a while, and closes once the probes succeed;
//! - [`retry::RetryBudget`]: retries limited to a share of the traffic plus a small floor, so
//!   a failing backend is not hit with a retry storm;
//! - [`retry::backoff`]: exponential backoff with full jitter between attempts.

pub mod breaker;
pub mod retry;
