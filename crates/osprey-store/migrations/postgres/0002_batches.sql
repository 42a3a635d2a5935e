-- Files uploaded for the Batch API (and its output files), and batches.
CREATE TABLE files (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    filename   TEXT NOT NULL,
    purpose    TEXT NOT NULL,
    bytes      BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    content    BYTEA NOT NULL
);
CREATE INDEX files_tenant ON files (tenant);

CREATE TABLE batches (
    id                TEXT PRIMARY KEY,
    tenant            TEXT NOT NULL,
    endpoint          TEXT NOT NULL,
    input_file_id     TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status            TEXT NOT NULL,
    output_file_id    TEXT,
    created_at        BIGINT NOT NULL,
    completed_at      BIGINT,
    total             BIGINT NOT NULL DEFAULT 0,
    completed         BIGINT NOT NULL DEFAULT 0,
    failed            BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX batches_tenant ON batches (tenant);
CREATE INDEX batches_status ON batches (status);
