-- +goose Up
-- A claim names the session that vouches for its owner: the key of a
-- session-level advisory lock that the owning worker process holds on a
-- connection of its own (inbox.Store.Start). When that session ends (the
-- process died, the server restarted) the lock is gone, and a redelivered
-- copy may take the claim over at once instead of waiting out its lease;
-- the takeover is fenced like a lease takeover (docs/design.md, "Claims
-- and their owners"). NULL: a claim taken without a session, freed by its
-- lease only. Adding a nullable column does not rewrite the table; on a
-- partitioned inbox it reaches every partition.
ALTER TABLE inboxmq_inbox ADD COLUMN owner_session bigint;

-- +goose Down
ALTER TABLE inboxmq_inbox DROP COLUMN owner_session;
