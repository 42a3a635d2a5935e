-- Per-tenant feature flags: a name and a JSON value, read by the gateway at request time.
CREATE TABLE feature_flags (
    tenant     TEXT NOT NULL,
    flag       TEXT NOT NULL,
    value      TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, flag)
);
INSERT INTO change_counters (name, value) VALUES ('flags', 0);
