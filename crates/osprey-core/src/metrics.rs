//! Names of every Prometheus metric Osprey exports, in one place.
//!
//! Labels are bounded sets (model, route, status, priority), never request ids or user text.

/// Requests by route and status (`route`, `status`).
pub const HTTP_REQUESTS: &str = "osprey_http_requests_total";
/// Request duration in seconds by route and status.
pub const HTTP_REQUEST_DURATION: &str = "osprey_http_request_duration_seconds";
/// Time from request arrival to the first generated token, seconds (`model`).
pub const TIME_TO_FIRST_TOKEN: &str = "osprey_time_to_first_token_seconds";
/// Time between consecutive output tokens of a request, seconds (`model`).
pub const TIME_PER_OUTPUT_TOKEN: &str = "osprey_time_per_output_token_seconds";
/// End-to-end generation latency, seconds (`model`).
pub const E2E_LATENCY: &str = "osprey_e2e_request_latency_seconds";
/// Prompt tokens processed (`model`).
pub const PROMPT_TOKENS: &str = "osprey_prompt_tokens_total";
/// Tokens generated (`model`).
pub const GENERATION_TOKENS: &str = "osprey_generation_tokens_total";
/// Time from the engine receiving a sequence to its first token, seconds.
pub const ENGINE_QUEUE_TO_FIRST_TOKEN: &str = "osprey_engine_time_to_first_token_seconds";
/// Tokens per forward pass.
pub const BATCH_TOKENS: &str = "osprey_batch_tokens";
/// Sequences per forward pass.
pub const BATCH_SEQUENCES: &str = "osprey_batch_sequences";
/// Sequences in the running batch.
pub const RUNNING_SEQUENCES: &str = "osprey_running_sequences";
/// Sequences waiting for admission.
pub const WAITING_SEQUENCES: &str = "osprey_waiting_sequences";
/// Free KV cache blocks.
pub const KV_BLOCKS_FREE: &str = "osprey_kv_blocks_free";
