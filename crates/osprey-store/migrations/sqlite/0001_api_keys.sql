-- API keys, stored only as SHA-256 hashes of the secret.
CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    hash         TEXT NOT NULL UNIQUE,
    prefix       TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    name         TEXT,
    rpm          INTEGER,
    tpm          INTEGER,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER,
    last_used_at INTEGER,
    revoked_at   INTEGER
);
CREATE INDEX api_keys_tenant ON api_keys (tenant);

-- Counters other processes poll to notice changes (`keys` bumps on every create and revoke).
CREATE TABLE change_counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO change_counters (name, value) VALUES ('keys', 0);
