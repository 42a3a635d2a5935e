-- Layered memory. Episodic: durable facts and preferences of a tenant's user. Working: named
-- scratchpads of a task or agent run, each with an expiry. Session: the summary of a
-- conversation's older turns, through the item it covers.
CREATE TABLE memory_facts (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    content    TEXT NOT NULL,
    source     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX memory_facts_owner ON memory_facts (tenant, user_id, content);

CREATE TABLE working_memory (
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    name       TEXT NOT NULL,
    content    TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, user_id, name)
);
CREATE INDEX working_memory_expiry ON working_memory (expires_at);

CREATE TABLE conversation_summaries (
    conversation_id TEXT PRIMARY KEY,
    through_seq     BIGINT NOT NULL,
    content         TEXT NOT NULL,
    created_at      BIGINT NOT NULL
);

-- One row per generation request: who, what model, which prompt version, what the prompt
-- builder injected, how it ended. Never the text.
CREATE TABLE request_log (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              TEXT NOT NULL,
    tenant          TEXT NOT NULL,
    user_id         TEXT NOT NULL,
    route           TEXT NOT NULL,
    model           TEXT NOT NULL,
    status          BIGINT NOT NULL,
    prompt_name     TEXT,
    prompt_version  BIGINT,
    conversation_id TEXT,
    injected        TEXT NOT NULL,
    cache           TEXT,
    latency_ms      BIGINT NOT NULL,
    created_at      BIGINT NOT NULL
);
CREATE INDEX request_log_owner ON request_log (tenant, user_id, seq);
