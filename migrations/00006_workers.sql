-- +goose Up
-- The worker processes, as each announces itself (control.Heartbeat): one
-- row per worker (its Config.Name), with the namespaces of its routes and
-- whether it runs the runtime controls, so that inboxctl and the console
-- can say how many live workers obey a pause. A running worker refreshes
-- last_seen every few seconds; a graceful stop sets stopped_at and keeps
-- the row; rows not seen for 7 days are deleted by the heartbeats.
CREATE TABLE inboxmq_workers (
    id         text        PRIMARY KEY,
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    namespaces text[]      NOT NULL DEFAULT '{}',
    version    text        NOT NULL,
    controls   boolean     NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen  timestamptz NOT NULL DEFAULT now(),
    stopped_at timestamptz
);

-- +goose Down
DROP TABLE inboxmq_workers;
