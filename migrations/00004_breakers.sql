-- +goose Up
-- The circuit breakers' states, published by the running workers (one row
-- per consumer, downstream and worker process) so that inboxctl shows them.
-- A worker writes its row on each transition and deletes its rows when it
-- stops; a row left by a crashed worker shows its age in changed_at.
CREATE TABLE inboxmq_breakers (
    consumer   text        NOT NULL,
    downstream text        NOT NULL,
    worker     text        NOT NULL,
    state      text        NOT NULL CHECK (state IN ('closed', 'half-open', 'open')),
    changed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, downstream, worker)
);

-- +goose Down
DROP TABLE inboxmq_breakers;
