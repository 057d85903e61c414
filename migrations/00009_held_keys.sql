-- +goose Up
-- Ordering keys of strict ordered routes (OrderedOpts.Strict) held after a
-- dead letter: the key's later messages wait here, in order, until an
-- operator releases the key (its dead-lettered head runs again first) or
-- skips its head (docs/ordering.md, "Strict routes").
CREATE TABLE inboxmq_held_keys (
    consumer        text        NOT NULL, -- the route's namespace
    ordering_key    text        NOT NULL,
    queue           text        NOT NULL, -- the route's queue
    exchange        text        NOT NULL, -- released messages go out through it
    -- held: waiting for an operator; releasing: the parked messages go
    -- back to the key's shard one at a time, lowest seq first.
    state           text        NOT NULL DEFAULT 'held' CHECK (state IN ('held', 'releasing')),
    -- The parked copy of the dead-lettered head (NULL once it was skipped
    -- or went out), and the one parked message out for its run.
    head_seq        bigint,
    released_seq    bigint,
    next_seq        bigint      NOT NULL DEFAULT 1,
    head_message_id text        NOT NULL DEFAULT '',
    head_key        text        NOT NULL DEFAULT '', -- the head's idempotency key, when it had one
    reason          text        NOT NULL,            -- the head's dead-letter reason
    last_error      text        NOT NULL DEFAULT '',
    held_at         timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, ordering_key)
);

-- The messages of a held key, in arrival order (seq), as they will be
-- published again: headers in the outbox's typed JSON encoding, AMQP
-- properties as in inboxmq_outbox.properties.
CREATE TABLE inboxmq_held_messages (
    consumer     text        NOT NULL,
    ordering_key text        NOT NULL,
    seq          bigint      NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    properties   jsonb       NOT NULL,
    content_type text        NOT NULL DEFAULT '',
    body         bytea       NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, ordering_key, seq),
    FOREIGN KEY (consumer, ordering_key) REFERENCES inboxmq_held_keys ON DELETE CASCADE
);

-- +goose Down
DROP TABLE inboxmq_held_messages;
DROP TABLE inboxmq_held_keys;
