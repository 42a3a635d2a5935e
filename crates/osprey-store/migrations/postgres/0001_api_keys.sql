-- API keys, stored only as SHA-256 hashes of the secret.
CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    hash         TEXT NOT NULL UNIQUE,
    prefix       TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    name         TEXT,
    rpm          BIGINT,
    tpm          BIGINT,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT,
    last_used_at BIGINT,
    revoked_at   BIGINT
);
CREATE INDEX api_keys_tenant ON api_keys (tenant);

-- Counters other processes poll to notice changes (`keys` bumps on every create and revoke).
CREATE TABLE change_counters (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO change_counters (name, value) VALUES ('keys', 0);
