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
// NewStore checks the primary once. Build the pool through
// [ConfigurePool] and the check holds for every connection the pool opens
// later: with a multi-host URL listing the primary and its standbys, new
// connections skip standbys and fenced nodes, and after a fail-over every
// connection ends up on the new primary.
//
//	cfg, err := pgxpool.ParseConfig("postgres://app@pg1:5432,pg2:5432/app?target_session_attrs=read-write")
//	err = inbox.ConfigurePool(cfg)
//	pool, err := pgxpool.NewWithConfig(ctx, cfg)
//
// # Transactional mode
//
// For effects inside PostgreSQL. [Handler] adapts a [TxHandlerFunc] into
// an inboxtype.Handler that claims the key and runs the handler in one
// transaction, on the same pgx.Tx: the inbox row and the business writes
// commit together or not at all, and the consumer acks only after the
// commit.
//
//	consumer.Register(router, "payments", inbox.Handler(store,
//		func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[Payment]) error {
//			_, err := tx.Exec(ctx, `INSERT INTO payments …`, …)
//			return err
//		}, nil), nil)
//
// A key that is already completed is a duplicate ([retry.ErrDuplicate]):
// the handler does not run and the delivery is acked. The same key with a
// different payload fingerprint (see inboxtype.Fingerprinter) is a
// permanent [retry.ErrKeyConflict]: the delivery is dead-lettered. A failed
// attempt rolls back everything the handler wrote and is recorded on the
// row (attempts, last_error, last_failed_at). Two copies of a key handled
// at once, on one worker or two, are serialised by the inbox row's primary
// key: the second waits until the first commits (then it is a duplicate)
// or rolls back (then it runs).
//
// The statements each mode sends, and which of them travel together, are
// in docs/internals.md; measured figures in docs/performance.md.
//
// # Attempts and deliveries
//
// A row's attempts is the broker attempt (the x-attempt header,
// inboxtype.Delivery.Attempt) of the last delivery that took the key up or
// failed on it, in both modes. In-process tries of one delivery and the
// broker's redeliveries of it do not add to it, so it is the number a
// dead-letter copy of the key carries in x-attempt, and a replay from the
// DLQ starts again at 1. The deliveries column is the crash-loop counter
// only: it counts the broker's redeliveries of the key on classic queues
// (see StoreConfig.CrashLimit), not every delivery.
//
// # Dead letters
//
// Add [Store.DeadLetterObserver] to consumer.Config.Observers and a key
// whose delivery the consumer dead-letters gets a dead row, whose last
// error is the dead-letter copy's x-error (reason: error) and whose
// attempts is the copy's x-attempt; a replay from the DLQ takes it up
// again.
//
// # Results
//
// A handler may record its job's result with inboxtype.Message.SetResult:
// the inbox stores it on the key's row in the transaction of the effect
// (in claim mode, with Claim.Complete), bounded by
// StoreConfig.MaxResultBytes, and hands it to every later duplicate of the
// key in inboxtype.Delivery.Result — also to a duplicate that waited for
// the first delivery to commit. The bytes are kept as the handler set
// them: the delivery that did the work, [Store.Get] (Record.Result) and
// every duplicate get the same bytes. A handler that fails stores none.
//
// # Group commit
//
// One commit per delivery is what limits per-message throughput. With a
// [GroupCommit] given to [Handler] or [BatchHandler], deliveries handled
// concurrently share one transaction and one commit (at most 64 of them
// when each takes a savepoint), and each keeps its own outcome: its
// handler runs in its own savepoint, so a failure rolls back only that
// delivery's writes and is recorded on its row, and every caller gets its
// own result, after the commit. Batches that share keys never deadlock, and two
// deliveries of one key in a batch run one after the other, so the second
// meets the first's outcome. Both modes take the same steps (claim,
// verdict, failure record, commit), so a key is decided alike in both.
//
// What a handler may assume changes: its transaction is the batch's,
// shared with the other deliveries' handlers (it still must not commit or
// roll it back), and a handler can run twice, the first run rolled back:
// when the batch's COMMIT fails (its deliveries then run again one by one,
// each in a transaction of its own, so that only the one whose writes fail
// at commit fails), and when a statement that broke the batch's connection
// makes the rest of the batch run again.
//
// A [BatchHandler]'s group is optimistic: each handler queues its writes
// before the group forms, and the group's claims and writes go to
// PostgreSQL in one round trip, as one transaction that commits whole or
// not at all. A group that cannot commit whole runs as above, so each
// delivery still gets its own verdict.
//
// # Claim/lease mode
//
// For effects outside PostgreSQL (a payment gateway, an e-mail),
// [ClaimHandler] claims the key before the handler runs (status
// processing, an owner token, a fence, a lease), keeps the lease alive
// with a heartbeat, and hands the handler a [Claim]: pass Claim.Key
// downstream as the Idempotency-Key, wrap outside calls in [Claim.Step]
// (recovery points a retry skips), and commit the business writes with
// [Claim.Complete], fenced on the owner token, so that a worker whose lease
// expired and was taken over cannot commit over the new owner. A lost
// lease cancels the handler's context with cause [ErrLeaseLost].
//
// Nothing is acked on the strength of a claim, so a claim is committed
// without waiting for its disk flush (ClaimOpts.DurableClaim opts out): a
// claim lost in a database crash makes the completion find no claim, and
// the delivery is retried, never acked. The completion, on which the ack
// rests, is always durable.
//
// A [GroupCommit] given to [ClaimHandler] group-commits the completions: the Complete calls
// of concurrent deliveries share one transaction, each callback in its own
// savepoint, and one commit makes the batch durable before any of them
// returns. A claim taken over drops out alone, with its own verdict, and
// nothing of it is written; a callback that fails is rolled back alone and its claim
// released in the same transaction. A callback can run twice, the first
// run rolled back (see [ClaimHandler]).
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
// write or the inbox's own claim of the key raised it. A row for which a
// partitioned table has no partition is not the message's fault: it is
// retried (reason db_no_partition), and when the table is the inbox's own
// (its partitions ahead ran out), the store creates the missing partitions
// so that the retry finds them.
//
// # Tracing
//
// The inbox starts child spans inbox.claim, inbox.handler and inbox.commit
// of the caller's span, through the caller's TracerProvider; without a
// span in the context they are no-ops.
package inbox
