-- +goose Up
-- The payment-worker's business tables. They live beside inboxmq_inbox and
-- are written in the same transaction as the inbox row.

-- One row per order: the primary key is the business identity.
CREATE TABLE payments (
    order_id     text        PRIMARY KEY,
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    currency     char(3)     NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Append-only balance mutations. Deliberately no unique constraint on
-- order_id: exactly one entry per order is the framework's guarantee, and
-- the acceptance tests count the rows to prove it.
CREATE TABLE ledger_entries (
    id           bigserial   PRIMARY KEY,
    order_id     text        NOT NULL,
    amount_cents bigint      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_entries_order_idx ON ledger_entries (order_id);

-- +goose Down
DROP TABLE ledger_entries;
DROP TABLE payments;
