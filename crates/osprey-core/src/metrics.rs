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
/// Tokens drafted for verification (speculative decoding).
pub const SPEC_DRAFT_TOKENS: &str = "osprey_spec_draft_tokens_total";
/// Drafted tokens the target model accepted.
pub const SPEC_ACCEPTED_TOKENS: &str = "osprey_spec_accepted_tokens_total";
/// Per verified draft: how many of its tokens were accepted.
pub const SPEC_ACCEPTED_LENGTH: &str = "osprey_spec_accepted_length";
/// Sequences in the running batch.
pub const RUNNING_SEQUENCES: &str = "osprey_running_sequences";
/// Sequences waiting for admission.
pub const WAITING_SEQUENCES: &str = "osprey_waiting_sequences";
/// Free KV cache blocks.
pub const KV_BLOCKS_FREE: &str = "osprey_kv_blocks_free";
/// KV cache blocks held by sequences.
pub const KV_BLOCKS_USED: &str = "osprey_kv_blocks_used";
/// Cached KV blocks reused for other content.
pub const KV_BLOCKS_EVICTED: &str = "osprey_kv_blocks_evicted_total";
/// Prompt tokens looked up in the prefix cache.
pub const PREFIX_CACHE_QUERIED_TOKENS: &str = "osprey_prefix_cache_queried_tokens_total";
/// Prompt tokens found in the prefix cache (hit rate = hit / queried).
pub const PREFIX_CACHE_HIT_TOKENS: &str = "osprey_prefix_cache_hit_tokens_total";
/// Sequences preempted for lack of KV memory or for interactive work.
pub const PREEMPTIONS: &str = "osprey_preemptions_total";
/// Wall time of one engine step (schedule, forward pass, sampling), seconds.
pub const STEP_DURATION: &str = "osprey_engine_step_seconds";
/// Counter: KV blocks found in a tier below the hot pool and brought back up, by `tier`
/// (`warm`, `cold`, `redis`).
pub const KV_TIER_HITS: &str = "osprey_kv_tier_hits_total";
/// Counter: fetches from the lower tiers that stopped short of the blocks asked for.
pub const KV_TIER_MISSES: &str = "osprey_kv_tier_misses_total";
/// Counter: KV blocks written into a tier, by `tier`.
pub const KV_TIER_STORED: &str = "osprey_kv_tier_stored_blocks_total";
/// Gauge: bytes a tier holds, by `tier`.
pub const KV_TIER_BYTES: &str = "osprey_kv_tier_bytes";
/// Gauge: blocks a tier holds, by `tier` (`hot` counts blocks holding a cached prefix).
pub const KV_TIER_BLOCKS: &str = "osprey_kv_tier_blocks";
/// Wall time of one fetch from the lower tiers (all its blocks), seconds.
pub const KV_TIER_FETCH_DURATION: &str = "osprey_kv_tier_fetch_seconds";
/// Counter: hot-pool blocks evicted down to the lower tiers.
pub const KV_TIER_DEMOTED: &str = "osprey_kv_tier_demoted_blocks_total";
/// Counter: blocks brought back into the hot pool from a lower tier, by `tier`.
pub const KV_TIER_PROMOTED: &str = "osprey_kv_tier_promoted_blocks_total";
/// Wall time of planning one step (the scheduler alone), seconds.
pub const SCHEDULE_DURATION: &str = "osprey_scheduler_plan_seconds";
/// Steps sequences were held back to keep an expert under capacity (`kda`).
pub const SCHEDULER_DEFERRALS: &str = "osprey_scheduler_deferrals_total";
/// Per step of an MoE model: the busiest expert's tokens over the mean expert's, averaged over
/// MoE layers (1 is perfectly balanced).
pub const EXPERT_LOAD_IMBALANCE: &str = "osprey_expert_load_imbalance_ratio";
/// Per step of an MoE model: experts that received tokens, averaged over MoE layers.
pub const EXPERTS_ACTIVE: &str = "osprey_experts_active";
/// Requests refused because the waiting queue was full.
pub const REJECTED_OVERLOADED: &str = "osprey_requests_rejected_overloaded_total";
/// Gauge: 1 while rate limits are shared through Redis, 0 while this replica falls back to
/// local limits.
pub const RATELIMIT_REDIS_UP: &str = "osprey_ratelimit_redis_up";
/// Counter: Redis calls of the rate limiter that failed or timed out.
pub const RATELIMIT_REDIS_ERRORS: &str = "osprey_ratelimit_redis_errors_total";
/// Counter: Redis calls of the rate limiter, by `call` (`check` on a request's path,
/// `top_up` and `return` of leases, `settle`).
pub const RATELIMIT_REDIS_CALLS: &str = "osprey_ratelimit_redis_calls_total";
/// Counter: requests admitted from units leased from Redis, without a round trip.
pub const RATELIMIT_LEASED: &str = "osprey_ratelimit_leased_total";
/// Counter: requests refused with 429, by tenant and limit (`requests`, `tokens`,
/// `concurrency`).
pub const RATE_LIMITED: &str = "osprey_requests_rate_limited_total";
/// Counter: requests refused for a missing, unknown, expired or revoked key.
pub const AUTH_FAILURES: &str = "osprey_auth_failures_total";
/// Counter: requests shed by admission control, by priority.
pub const ADMISSION_SHED: &str = "osprey_requests_shed_total";
/// Gauge: requests in flight through the gateway.
pub const IN_FLIGHT: &str = "osprey_requests_in_flight";
/// Counter: requests forwarded to an upstream, by model and outcome.
pub const UPSTREAM_REQUESTS: &str = "osprey_upstream_requests_total";
/// Counter: requests a fallback model served after their own failed, by `from` and `to`.
pub const FALLBACKS: &str = "osprey_fallbacks_total";
/// Counter: retries sent to an upstream, by model.
pub const UPSTREAM_RETRIES: &str = "osprey_upstream_retries_total";
/// Counter: retries the upstream's retry budget refused, by model.
pub const UPSTREAM_RETRIES_REFUSED: &str = "osprey_upstream_retries_refused_total";
/// Gauge: an upstream's circuit breaker, by model: 0 closed, 1 half-open, 2 open.
pub const UPSTREAM_BREAKER_STATE: &str = "osprey_upstream_breaker_state";
/// Gauge: whether a pool's worker takes requests (1) or is ejected (0), by worker.
pub const WORKER_LIVE: &str = "osprey_worker_live";
/// Counter: requests sent to a worker, by worker and routing policy.
pub const WORKER_REQUESTS: &str = "osprey_worker_requests_total";
/// Counter: prompt blocks of requests routed to workers, and of those the blocks the chosen
/// worker was known to hold (`cached="true"`).
pub const WORKER_PROMPT_BLOCKS: &str = "osprey_worker_prompt_blocks_total";
/// Counter: requests retried on another worker after theirs failed, by the failed worker.
pub const WORKER_FAILOVERS: &str = "osprey_worker_failovers_total";
/// Counter: `auto` requests, by the tier chosen and the task the classifier saw.
pub const AUTO_ROUTED: &str = "osprey_auto_routed_total";
/// Gauge: the degradation ladder's level (0 none … 5), from the gateway's load.
pub const DEGRADATION_LEVEL: &str = "osprey_degradation_level";
/// Counter: responses degraded, by level.
pub const DEGRADED: &str = "osprey_requests_degraded_total";
/// Counter: `auto` answers below the logprob floor, asked again of the tier above, by tier.
pub const AUTO_ANSWERS_ESCALATED: &str = "osprey_auto_answers_escalated_total";
/// Counter: guard findings acted on, by tenant, category, action and source of the text.
pub const GUARD_VERDICTS: &str = "osprey_guard_verdicts_total";
/// Counter: keys throttled for too many flagged requests, by tenant.
pub const ABUSE_THROTTLED: &str = "osprey_abuse_throttled_total";
/// Counter: lookups of the exact response cache, by result (`hit`, `miss`).
pub const RESPONSE_CACHE: &str = "osprey_response_cache_total";
/// Counter: lookups of the semantic response cache, by result (`hit`, `miss`).
pub const SEMANTIC_CACHE: &str = "osprey_semantic_cache_total";
/// Counter: request-log rows dropped (the queue full, or the store failing).
pub const REQUEST_LOG_DROPPED: &str = "osprey_request_log_dropped_total";
/// Counter: conversation summaries made, by result (`ok`, `failed`).
pub const SUMMARIES: &str = "osprey_conversation_summaries_total";
/// Counter: facts found in users' words and kept as episodic memory.
pub const FACTS_EXTRACTED: &str = "osprey_memory_facts_extracted_total";
/// Counter: chunks embedded and indexed by ingest jobs.
pub const RAG_CHUNKS_INGESTED: &str = "osprey_rag_chunks_ingested_total";
/// Histogram: collection search latency, seconds (`rerank`: `true`, `false`).
pub const RAG_SEARCH_DURATION: &str = "osprey_rag_search_duration_seconds";
/// Counter: retrieved passages the injection guard kept out of a prompt.
pub const RAG_PASSAGES_DROPPED: &str = "osprey_rag_passages_dropped_total";
/// Gauge: collections last indexed longer ago than their re-index interval (stale indexes).
pub const RAG_STALE_COLLECTIONS: &str = "osprey_rag_stale_collections";
/// Counter: repeats of an idempotent request given the first one's answer.
pub const REPLAYED: &str = "osprey_requests_replayed_total";
/// Counter: answers served from the recent answers, by why (`degraded`, `fallback`).
pub const CACHED_ANSWERS: &str = "osprey_cached_answers_served_total";
/// Agent run steps taken, by kind (`decide`, `act`, `observe`, `approval`, `finish`).
pub const AGENT_STEPS: &str = "osprey_agent_steps_total";
/// Agent runs that ended or paused, by status.
pub const AGENT_RUNS: &str = "osprey_agent_runs_total";
/// Tool calls, by tool (built-in, `mcp:SERVER` or `other`) and verdict.
pub const TOOL_CALLS: &str = "osprey_tool_calls_total";
/// Grammars compiled for requests (structured output; tool calls are `lark`), by grammar kind.
pub const CONSTRAINED_REQUESTS: &str = "osprey_constrained_requests_total";
