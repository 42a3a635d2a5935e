-- Conversations, per tenant and user, and their items (messages), in order.
CREATE TABLE conversations (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    metadata   TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX conversations_owner ON conversations (tenant, user_id);

CREATE TABLE conversation_items (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL,
    role            TEXT NOT NULL,
    content         TEXT NOT NULL,
    created_at      BIGINT NOT NULL
);
CREATE INDEX conversation_items_order ON conversation_items (conversation_id, seq);
