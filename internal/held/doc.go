// Package held keeps the order of a strict ordered route's keys after a
// dead letter (OrderedOpts.Strict): the dead-lettered message's ordering
// key is held, the key's later messages are parked in PostgreSQL in their
// order, and nothing of the key runs until an operator releases it (its
// head runs again first) or skips its head; the parked messages then go
// back to the key's shard one at a time, through the outbox, each after
// the one before it has committed. docs/ordering.md describes it for
// users; inboxctl ordered and the console operate it.
package held
