-- Offline evaluation runs (osprey eval): a summary to list them by, the whole report as JSON.
CREATE TABLE eval_runs (
    id         TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    suite      TEXT NOT NULL,
    target     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    summary    TEXT NOT NULL,
    report     TEXT NOT NULL
);
CREATE INDEX eval_runs_created ON eval_runs (created_at);
