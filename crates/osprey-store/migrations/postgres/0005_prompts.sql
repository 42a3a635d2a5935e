-- The prompt registry: immutable versions of each named prompt (a template and model settings,
-- as JSON), and labels pointing at one version or splitting traffic between several. Every
-- label change is kept, so a label can be rolled back.
CREATE TABLE prompt_versions (
    name       TEXT NOT NULL,
    version    BIGINT NOT NULL,
    body       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE prompt_label_changes (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       TEXT NOT NULL,
    label      TEXT NOT NULL,
    split      TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX prompt_label_changes_label ON prompt_label_changes (name, label, seq);
