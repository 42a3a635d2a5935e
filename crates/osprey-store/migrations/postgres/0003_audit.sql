-- The safety audit log: every guard verdict acted on (flagged, redacted or blocked), without
-- the text it was about.
CREATE TABLE audit (
    id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       BIGINT NOT NULL,
    tenant   TEXT NOT NULL,
    key_id   TEXT,
    source   TEXT NOT NULL,
    category TEXT NOT NULL,
    rule     TEXT NOT NULL,
    action   TEXT NOT NULL,
    score    DOUBLE PRECISION NOT NULL
);
CREATE INDEX audit_tenant_at ON audit (tenant, at);
