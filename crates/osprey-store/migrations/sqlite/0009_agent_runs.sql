-- Agent runs (the Responses API): each run's request and state (its transcript, budget and
-- spending, as JSON), its steps, and the audit of every tool call; and the tool scopes a key
-- is granted (NULL: its tenant's).
CREATE TABLE agent_runs (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    key_id      TEXT,
    model       TEXT NOT NULL,
    status      TEXT NOT NULL,
    request     TEXT NOT NULL,
    state       TEXT NOT NULL,
    previous_id TEXT,
    replay_of   TEXT,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
CREATE INDEX agent_runs_owner ON agent_runs (tenant, user_id, created_at);
CREATE INDEX agent_runs_status ON agent_runs (status, updated_at);

CREATE TABLE agent_steps (
    run_id      TEXT NOT NULL,
    n           INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    detail      TEXT NOT NULL,
    tokens      INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    PRIMARY KEY (run_id, n)
);

CREATE TABLE tool_audit (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    at           INTEGER NOT NULL,
    tenant       TEXT NOT NULL,
    key_id       TEXT,
    run_id       TEXT NOT NULL,
    call_id      TEXT NOT NULL,
    tool         TEXT NOT NULL,
    arguments    TEXT NOT NULL,
    result_bytes INTEGER NOT NULL,
    duration_ms  INTEGER NOT NULL,
    verdict      TEXT NOT NULL,
    detail       TEXT NOT NULL
);
CREATE INDEX tool_audit_tenant_at ON tool_audit (tenant, at);
CREATE INDEX tool_audit_run ON tool_audit (run_id);

ALTER TABLE api_keys ADD COLUMN tool_scopes TEXT;
