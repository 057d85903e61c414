// Package outboxwire is what the two sides of the outbox agree on: package
// outbox writes the rows (Enqueue, in the caller's transaction) and
// internal/relay publishes them. It holds the encoding of the headers
// column, the insert statement (and its merged form for a group commit,
// MergeInserts), the NOTIFY channel that wakes the relays on commit, and the
// mark by which a unit of work leaves that NOTIFY out because its own
// process's relay is woken in-process instead.
package outboxwire

// NotifyChannel is the PostgreSQL NOTIFY channel on which an enqueue wakes
// the relays. The payload is the schema of the outbox table
// (current_schema()), so relays of other schemas in the same database
// ignore it.
const NotifyChannel = "inboxmq_outbox"
