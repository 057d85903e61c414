-- +goose Up
-- The outbox: outgoing messages written in the same transaction as the
-- business writes, published by a relay with publisher confirms and marked
-- sent only after the broker confirmed them.
CREATE TABLE inboxmq_outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The stable AMQP message id: the same for every attempt to publish the
    -- row, so a relay crash between confirm and mark only produces a
    -- duplicate that the receiver's inbox absorbs.
    message_id      text        NOT NULL UNIQUE,
    exchange        text        NOT NULL DEFAULT '',
    routing_key     text        NOT NULL DEFAULT '',
    -- AMQP headers in a typed JSON encoding (internal/outboxwire/headers.go).
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    content_type    text        NOT NULL DEFAULT '',
    body            bytea       NOT NULL,
    -- Rows with the same ordering key go out one at a time, in id order.
    -- NULL: no ordering constraint.
    ordering_key    text,
    idempotency_key text,
    -- Failed publishes (nack, unroutable) back off per row.
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    available_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- NULL while pending; set after the broker's confirm.
    sent_at         timestamptz
);

-- The relay's claim: pending rows in id order.
CREATE INDEX inboxmq_outbox_pending_idx ON inboxmq_outbox (id) WHERE sent_at IS NULL;
-- The claim's ordering check: the head of each ordering key's pending rows.
CREATE INDEX inboxmq_outbox_ordering_idx ON inboxmq_outbox (ordering_key, id) WHERE sent_at IS NULL AND ordering_key IS NOT NULL;
-- Retention: sent rows by age, deleted in small batches.
CREATE INDEX inboxmq_outbox_sent_idx ON inboxmq_outbox (sent_at) WHERE sent_at IS NOT NULL;

-- +goose Down
DROP TABLE inboxmq_outbox;
