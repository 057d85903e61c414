-- +goose Up
-- A row may carry the AMQP properties of a whole message, not only its id
-- and content type: a retry that the worker schedules in the outbox (the
-- copy of a failed delivery, published back to its work queue when due)
-- keeps its original's message id, correlation id, reply-to, timestamp and
-- the rest (docs/design.md, "Retries"). NULL: the relay sets the
-- properties itself, as before. Adding a nullable column does not rewrite
-- the table.
ALTER TABLE inboxmq_outbox ADD COLUMN properties jsonb;

-- +goose Down
ALTER TABLE inboxmq_outbox DROP COLUMN properties;
