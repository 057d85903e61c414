-- +goose Up
-- Runtime controls that operators set (inboxctl pause/resume/concurrency)
-- and running workers read (control.Watcher): one row per consumer.
CREATE TABLE inboxmq_controls (
    consumer    text        PRIMARY KEY,
    paused      boolean     NOT NULL DEFAULT false,
    -- 0 restores the consumer's configured concurrency.
    concurrency integer     NOT NULL DEFAULT 0 CHECK (concurrency >= 0),
    reason      text,
    updated_by  text        NOT NULL DEFAULT current_user,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Keys (or key prefixes) blocked at ingress (inboxctl block/unblock): a
-- delivery whose idempotency key matches is parked in <queue>.parked
-- instead of being processed.
CREATE TABLE inboxmq_blocks (
    consumer   text        NOT NULL,
    pattern    text        NOT NULL CHECK (pattern <> ''),
    is_prefix  boolean     NOT NULL DEFAULT false,
    reason     text,
    created_by text        NOT NULL DEFAULT current_user,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, is_prefix, pattern)
);

-- +goose Down
DROP TABLE inboxmq_blocks;
DROP TABLE inboxmq_controls;
