-- +goose Up
-- The inbox: one row per (consumer, idempotency key). It is the source of
-- truth for "has this job's effect been committed?".
CREATE TABLE inboxmq_inbox (
    consumer       text        NOT NULL,
    key            text        NOT NULL,
    -- received: seen on a redelivery, nothing committed yet (crash counter)
    -- processing: claimed in claim/lease mode (owner, fence, lease_until)
    -- completed: the effect is committed; duplicates are acked
    -- failed: the last attempt failed and will be retried
    -- dead: dead-lettered; a replay may take it up again
    status         text        NOT NULL CHECK (status IN ('received', 'processing', 'completed', 'failed', 'dead')),
    fingerprint    bytea,
    owner          text,
    fence          bigint      NOT NULL DEFAULT 0,
    lease_until    timestamptz,
    attempts       integer     NOT NULL DEFAULT 0,
    deliveries     integer     NOT NULL DEFAULT 0,
    last_error     text,
    last_failed_at timestamptz,
    message_id     text,
    payload        bytea,
    result         jsonb,
    steps          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    completed_at   timestamptz,
    PRIMARY KEY (consumer, key)
);

-- The reconciler's scan: claims past their lease.
CREATE INDEX inboxmq_inbox_lease_idx ON inboxmq_inbox (lease_until) WHERE status = 'processing';
-- Retention: completed rows by age, deleted in small batches.
CREATE INDEX inboxmq_inbox_completed_idx ON inboxmq_inbox (completed_at) WHERE status = 'completed';

-- +goose Down
DROP TABLE inboxmq_inbox;
