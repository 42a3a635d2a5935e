-- ACL groups a key's requests belong to (comma-separated): retrieval shows them the documents
-- of these groups besides everyone's.
ALTER TABLE api_keys ADD COLUMN acl_groups TEXT NOT NULL DEFAULT '';
