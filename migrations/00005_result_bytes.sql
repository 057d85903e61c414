-- +goose Up
-- The job's result is kept byte for byte as the handler set it: json
-- stores its input text verbatim (after checking it is JSON), where jsonb
-- re-encodes it (keys reordered, spaces added). The first delivery replies
-- with the handler's bytes, so every duplicate must get those same bytes
-- back. Rows written before keep jsonb's text. On a partitioned inbox the
-- change applies to every partition, and partitions created later copy
-- the column (LIKE). The table is rewritten under an ACCESS EXCLUSIVE lock:
-- on a large inbox, run it when the workers can wait. Workers older than
-- this migration fail claim mode's completion after it (json does not
-- coerce to jsonb in their COALESCE): upgrade them first, then migrate
-- (docs/operations.md, "Upgrading to schema version 5").
ALTER TABLE inboxmq_inbox ALTER COLUMN result TYPE json USING result::json;

-- +goose Down
ALTER TABLE inboxmq_inbox ALTER COLUMN result TYPE jsonb USING result::jsonb;
