-- The request log grows to say where each request's time went and why it went where it did:
-- the key, the tier chosen and why, tokens and timings measured to the end of the answer, the
-- error if any, the trace id, a JSON detail (guard verdicts, retrieval hits, tool calls), and
-- the prompt and answer text for the sampled share of a tenant's requests (PII redacted).
ALTER TABLE request_log ADD COLUMN key_id TEXT;
ALTER TABLE request_log ADD COLUMN tier TEXT;
ALTER TABLE request_log ADD COLUMN route_reason TEXT;
ALTER TABLE request_log ADD COLUMN prompt_tokens BIGINT;
ALTER TABLE request_log ADD COLUMN completion_tokens BIGINT;
ALTER TABLE request_log ADD COLUMN ttft_ms BIGINT;
ALTER TABLE request_log ADD COLUMN tpot_us BIGINT;
ALTER TABLE request_log ADD COLUMN total_ms BIGINT;
ALTER TABLE request_log ADD COLUMN error TEXT;
ALTER TABLE request_log ADD COLUMN trace_id TEXT;
ALTER TABLE request_log ADD COLUMN detail TEXT NOT NULL DEFAULT '{}';
ALTER TABLE request_log ADD COLUMN prompt_text TEXT;
ALTER TABLE request_log ADD COLUMN response_text TEXT;
CREATE INDEX request_log_id ON request_log (id);
CREATE INDEX request_log_created ON request_log (created_at);
