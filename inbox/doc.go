// Package inbox is inboxmq's PostgreSQL inbox: one row per (consumer,
// idempotency key), written in the same transaction as the business
// writes, so that a duplicate delivery can never cause a duplicate effect.
// It is the source of truth; the Redis lock and completed-cache in front of
// it only save work.
//
// # Store
//
// [NewStore] wraps a *pgxpool.Pool on the primary (a replica is refused
// with [ErrReplica]: replicas lag) holding the inbox table of package
// migrations:
//
//	store, err := inbox.NewStore(ctx, pool, nil)
//
// # Transactional mode
//
// For effects inside PostgreSQL. [Handler] adapts a [TxHandlerFunc] into a
// inboxtype.Handler: BEGIN; claim the key (INSERT … ON CONFLICT DO UPDATE …
// WHERE status <> 'completed'); run the handler with the same pgx.Tx;
// COMMIT. The consumer acks only after Handle returns nil, so after the
// commit. A key that is already completed is a duplicate ([retry.ErrDuplicate]),
// and the same key with a different payload fingerprint (see
// inboxtype.Fingerprinter) is a permanent [retry.ErrKeyConflict]. A failed attempt
// rolls back and is recorded on the row (attempts, last_error,
// last_failed_at).
//
// # Attempts and deliveries
//
// A row's attempts is the broker attempt (the x-attempt header,
// inboxtype.Delivery.Attempt) of the last delivery that took the key up or
// failed on it, in both modes. In-process tries of one delivery and the
// broker's redeliveries of it do not add to it, so it is the number a
// dead-letter copy of the key carries in x-attempt, and a replay from the
// DLQ starts again at 1. The deliveries column is the crash-loop counter only: it counts the broker's
// redeliveries of the key on classic queues (see StoreConfig.CrashLimit),
// not every delivery.
//
// # Dead letters
//
// Add [Store.DeadLetterObserver] to consumer.Config.Observers and a key
// whose delivery the consumer dead-letters gets a dead row, whose last
// error is the dead-letter copy's x-error (reason: error) and whose
// attempts is the copy's x-attempt; a replay from the DLQ takes it up
// again.
//
//	consumer.Register(router, "payments", inbox.Handler(store,
//		func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
//			_, err := tx.Exec(ctx, `INSERT INTO payments …`, …)
//			return err
//		}, nil), nil)
//
// Round trips per delivery: BEGIN and the claim in one pipeline (pgx's
// Batch.BeginTx), the handler's own statements, COMMIT — 4 with two
// business inserts, where a hand-written pgx loop needs 5. A duplicate adds
// one look-up; a failure one ROLLBACK and one statement recording it. A
// redelivered delivery on a classic queue first pays one statement for the
// crash-loop counter (StoreConfig.CrashLimit).
//
// # Group commit
//
// The commit (fsync) is the bottleneck of one transaction per delivery.
// With HandlerOpts.GroupCommit, deliveries handled concurrently are
// collected into one transaction: their keys are claimed in one statement
// in (consumer, key) order (two batches sharing keys never deadlock), each
// handler runs inside its own SAVEPOINT (a failure rolls back only its
// writes and is recorded on its row in the same transaction), and one
// COMMIT makes them durable; then every caller gets its own result.
// Per-message mode is the batch of one of the same code path, without
// savepoints. Two deliveries of one key in a batch are run one after the
// other, so the second meets the first's outcome. Round trips per
// delivery: the handler's statements only — its SAVEPOINT travels in one
// pipeline with its first Exec — plus BEGIN with the claim and COMMIT,
// shared by the batch (with two business inserts and batches of 64: 2.03).
//
// GroupCommit.Pipeline goes further for handlers that only Exec: the
// batch's handlers run concurrently on its transaction and each round trip
// carries the next statement of every handler still running, so a batch
// of 64 handlers with two inserts each costs four round trips in all
// (BEGIN with the claim, two, COMMIT). It is optimistic: any handler error,
// failed statement or call other than Exec rolls the attempt back and the
// batch runs again serially with savepoints (so the handlers of such a
// batch run twice).
//
// # Claim/lease mode
//
// For effects outside PostgreSQL (a payment gateway, an e-mail),
// [ClaimHandler] claims the key in a short statement (status processing, an
// owner token, a fence, a lease), keeps the lease alive with a heartbeat,
// and hands the handler a [Claim]: pass Claim.Key downstream as the
// Idempotency-Key, wrap outside calls in [Claim.Step] (recovery points a
// retry skips), and commit the business writes with [Claim.Complete],
// fenced on the owner token, so that a worker whose lease expired and was
// taken over cannot commit over the new owner. A lost lease cancels the
// handler's context with cause [ErrLeaseLost].
//
// The claim is committed asynchronously (synchronous_commit off for its one
// statement; ClaimOpts.DurableClaim opts out), which saves a WAL flush per
// delivery: nothing is acked on the strength of a claim. A claim lost in a
// database crash makes the completion find no row, and the delivery is
// retried, never acked; the completion itself is always durable. Claims of
// concurrent deliveries that coincide share one statement, in key order:
// about 0.6 claim statements per delivery with 8 handlers, so claim mode
// sends 3.6 round trips per delivery to PostgreSQL (the claim, then BEGIN
// with the fenced completion and the first business statement, the
// second, COMMIT).
//
// ClaimOpts.GroupCommit group-commits the completions: Claim.Complete hands
// its completion to a batch of the handler's concurrent completions, whose
// fenced completions go out in one statement with BEGIN (a claim taken over
// drops out alone, with its own verdict); each callback then runs in its
// own SAVEPOINT, or with GroupCommit.Pipeline all of them concurrently, and
// one COMMIT makes the batch durable. A callback that fails is rolled back
// to its savepoint and its claim released in the same transaction. A
// completion alone in its batch takes the per-message path above. With 128
// handlers, one business insert and pipelined batches of 64, claim mode then
// sends 0.1 round trips per message to PostgreSQL for its completions
// (BenchmarkClaimGroupCommit), besides the shared claims.
//
// # Reconciler
//
// A claim whose worker vanished stays processing until its lease ends. The
// [Reconciler] finds such claims, reports them, and completes them when an
// [EffectCheck] finds the effect, or releases them for retry (or marks them
// dead after MaxAttempts). Operators read rows with [Store.Get] and
// [Store.Stale].
//
// # Errors
//
// Database errors are mapped into package retry's taxonomy by [MapError]:
// serialization failures, deadlocks and connection loss become retryable
// with a reason (db_serialization, db_deadlock, db_connection…), and a
// unique violation on a business table a duplicate (source
// business_constraint). A value PostgreSQL refuses (a data exception such
// as a NUL byte in a text column, reason db_data_exception) or a broken
// constraint other than a unique one (not null, foreign key, check: reason
// db_integrity_violation) fails the same way on every attempt, so it is
// permanent: the message is dead-lettered at once, whether the handler's
// write or the inbox's own claim of the key raised it.
//
// # Tracing
//
// The inbox starts child spans inbox.claim, inbox.handler and inbox.commit
// of the caller's span, through the caller's TracerProvider; without a
// span in the context they are no-ops.
package inbox
