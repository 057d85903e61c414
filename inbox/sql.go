package inbox

import "strings"

// statements are the store's SQL, built once per table name (quoted with
// pgx.Identifier). Every value is a parameter.
//
// The attempts column is the broker attempt (x-attempt) of the last
// delivery that took the key up (claim) or failed on it: each statement
// that writes it sets it to that delivery's number, so in-process tries and
// redeliveries of one broker attempt do not add to it, and a failed row
// shows the attempt its dead-letter copy carries.
type statements struct {
	// claim takes up a batch of keys in one statement, in a fixed
	// (consumer, key) order so that two batches sharing keys lock them in the
	// same order and never deadlock. A completed row, or a live claim of
	// claim mode, is not taken: no row comes back for it.
	claim string
	// claimOne is claim for one key (the per-message path), with scalar
	// parameters; it returns the fence alone.
	claimOne string
	// claimOrAbort is claimOne for the one-round-trip paths of
	// BatchHandler, with the handler's result ($7, NULL for none) written by
	// the claim itself: a key it does not claim raises an error, which
	// aborts the implicit transaction of the writes sent with it.
	claimOrAbort string
	// claimAllOrAbort is claimOrAbort for a group ($8 keys, distinct): it
	// returns the keys and their fences in byte order of (consumer, key),
	// Go's string order, or raises unless it claimed every key.
	claimAllOrAbort string
	// lookup reads the rows of keys the claim did not return.
	lookup string
	// failInTx records a failed attempt on a row claimed in this transaction.
	failInTx string
	// failAuto records a failed attempt after the transaction rolled back.
	failAuto string
	// redelivered counts a broker redelivery (the crash-loop bound).
	redelivered string
	// markDead records a dead letter of the key (DeadLetterObserver).
	markDead string
	// setResult records the handler's result on the row claimed (or, in
	// claim mode, completed) in this transaction.
	setResult string
	// setResults records the results of several deliveries of a group
	// commit, in the COMMIT's round trip.
	setResults string

	// claimLease takes one key in claim mode (autocommit); claimLeases
	// takes several, claimed by concurrent deliveries, in one statement in
	// (consumer, key) order. The Async variants commit asynchronously.
	claimLease       string
	claimLeaseAsync  string
	claimLeases      string
	claimLeasesAsync string
	extendLease      string
	completeWith     string
	// completeMany is the fenced completion of claim mode's group commit
	// (ClaimHandler's gc): it takes the place of the claim in a batch
	// of completions and returns what claim returns, (consumer, key,
	// fence) per row. A lone completion runs Claim's own path.
	completeMany string
	releaseClaim string
	recordStep   string
	// adoptClaims moves the claims of a lost owner session ($1) to the new
	// one ($2) (owner.go).
	adoptClaims string

	staleForUpdate    string
	reconcileComplete string
	reconcileRelease  string
}

// claimLeaseConflict is claim mode's conflict clause: only a free
// (received, failed, dead) row or an expired claim is taken.
const claimLeaseConflict = `ON CONFLICT (consumer, key) DO UPDATE SET
	status = 'processing', owner = EXCLUDED.owner, fence = i.fence + 1, lease_until = EXCLUDED.lease_until,
	attempts = EXCLUDED.attempts, fingerprint = EXCLUDED.fingerprint, message_id = EXCLUDED.message_id,
	payload = COALESCE(EXCLUDED.payload, i.payload), updated_at = now()
WHERE i.status IN ('received', 'failed', 'dead') OR (i.status = 'processing' AND i.lease_until <= now())
`

// ownerGone is true for a claim whose owner session (owner.go) has ended:
// its advisory lock is no longer held in this database. pg_locks splits a
// bigint key into classid (high 32 bits) and objid (low 32 bits), with
// objsubid 1. It is evaluated only for a claim still within its lease.
const ownerGone = `(i.owner_session IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.classid = (i.owner_session >> 32)::oid AND l.objid = (i.owner_session & 4294967295)::oid))`

// withOwnerSession makes a claim statement name its owner session
// (parameter $n of claimLease, the array $n of claimLeases) and lets it
// take over a claim whose owner session has ended.
func withOwnerSession(stmt, value string) string {
	stmt = strings.Replace(stmt, "(consumer, key, status, owner, ", "(consumer, key, status, owner, owner_session, ", 1)
	stmt = strings.Replace(stmt, "'processing', $3, ", "'processing', $3, "+value+", ", 1)
	stmt = strings.Replace(stmt, "'processing', k.owner, ", "'processing', k.owner, "+value+", ", 1)
	stmt = strings.Replace(stmt, "owner = EXCLUDED.owner, ", "owner = EXCLUDED.owner, owner_session = EXCLUDED.owner_session, ", 1)
	return strings.Replace(stmt, "(i.status = 'processing' AND i.lease_until <= now())",
		"(i.status = 'processing' AND (i.lease_until <= now() OR "+ownerGone+"))", 1)
}

// claimConflict is the claim's conflict clause, shared by claim and
// claimOne.
const claimConflict = `ON CONFLICT (consumer, key) DO UPDATE SET
	status = 'completed', fingerprint = EXCLUDED.fingerprint, message_id = EXCLUDED.message_id,
	payload = COALESCE(EXCLUDED.payload, i.payload), fence = i.fence + 1, attempts = EXCLUDED.attempts,
	owner = NULL, lease_until = NULL, completed_at = now(), updated_at = now()
WHERE i.status <> 'completed' AND NOT (i.status = 'processing' AND i.lease_until > now())
`

// buildStatements returns the statements on table t. fn is the bucket
// function of a partitioned table (migrations.PartitionInbox), "" for an
// unpartitioned one: each inserting statement then also sets the bucket
// column to fn(consumer, key), which serialises the claims of the key and
// finds its row in whichever partition holds it, and its conflict target
// includes bucket (docs/scaling.md). sessions says that the table has the
// owner_session column (migration 00007): claims then name their owner
// session ($9 of claimLease, $9 of claimLeases).
func buildStatements(t, fn string, sessions bool) statements {
	// col and val add the bucket column and its value to an INSERT.
	col := func() string { return "" }
	val := func(string, string) string { return "" }
	target := "(consumer, key)"
	if fn != "" {
		col = func() string { return ", bucket" }
		val = func(c, k string) string { return ", " + fn + "(" + c + ", " + k + ")" }
		target = "(consumer, key, bucket)"
	}
	conflict := strings.Replace(claimConflict, "(consumer, key)", target, 1)
	leaseConflict := strings.Replace(claimLeaseConflict, "(consumer, key)", target, 1)
	st := statements{
		claim: `INSERT INTO ` + t + ` AS i (consumer, key, status, fingerprint, message_id, payload, fence, attempts, completed_at` + col() + `)
SELECT k.consumer, k.key, 'completed', k.fp, k.mid, k.payload, 1, k.attempt, now()` + val("k.consumer", "k.key") + `
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bytea[], $6::int[]) AS k(consumer, key, fp, mid, payload, attempt)
ORDER BY k.consumer, k.key
` + conflict + `RETURNING consumer, key, fence`,

		claimOne: `INSERT INTO ` + t + ` AS i (consumer, key, status, fingerprint, message_id, payload, fence, attempts, completed_at` + col() + `)
VALUES ($1, $2, 'completed', $3, $4, $5, 1, $6, now()` + val("$1", "$2") + `)
` + conflict + `RETURNING fence`,

		lookup: `SELECT consumer, key, status, fingerprint,
	GREATEST(EXTRACT(EPOCH FROM (lease_until - now())), 0)::float8,
	CASE WHEN status = 'completed' THEN result::text END
FROM ` + t + `
WHERE (consumer, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))`,

		failInTx: `UPDATE ` + t + ` SET status = 'failed', completed_at = NULL, last_error = $3,
	last_failed_at = now(), updated_at = now()
WHERE consumer = $1 AND key = $2`,

		failAuto: `INSERT INTO ` + t + ` AS i (consumer, key, status, fingerprint, message_id, attempts, last_error, last_failed_at` + col() + `)
VALUES ($1, $2, 'failed', $3, $4, $6, $5, now()` + val("$1", "$2") + `)
ON CONFLICT ` + target + ` DO UPDATE SET
	status = 'failed', fingerprint = EXCLUDED.fingerprint, message_id = EXCLUDED.message_id,
	attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error, last_failed_at = now(), updated_at = now()
WHERE i.status NOT IN ('completed', 'processing')`,

		redelivered: `INSERT INTO ` + t + ` AS i (consumer, key, status, message_id, deliveries` + col() + `)
VALUES ($1, $2, 'received', $3, 1` + val("$1", "$2") + `)
ON CONFLICT ` + target + ` DO UPDATE SET
	deliveries = CASE WHEN i.status = 'dead' THEN 1 ELSE i.deliveries + 1 END,
	status = CASE
		WHEN i.status = 'dead' THEN 'received'
		WHEN i.status IN ('received', 'failed') AND $4::int >= 0 AND i.deliveries + 1 > $4::int THEN 'dead'
		ELSE i.status END,
	updated_at = now()
RETURNING status, deliveries`,

		// A claim still processing is its owner's (or the reconciler's) to
		// settle; a completed row stays completed.
		setResult: `UPDATE ` + t + ` SET result = $3::json WHERE consumer = $1 AND key = $2`,
		setResults: `UPDATE ` + t + ` AS i SET result = r.result::json
FROM unnest($1::text[], $2::text[], $3::text[]) AS r(consumer, key, result)
WHERE i.consumer = r.consumer AND i.key = r.key`,

		markDead: `UPDATE ` + t + ` SET status = 'dead', last_error = $3, attempts = $4,
	last_failed_at = now(), updated_at = now()
WHERE consumer = $1 AND key = $2 AND status NOT IN ('completed', 'processing')`,

		claimLease: `INSERT INTO ` + t + ` AS i (consumer, key, status, owner, fence, lease_until, attempts, fingerprint, message_id, payload` + col() + `)
VALUES ($1, $2, 'processing', $3, 1, now() + $4::bigint * interval '1 microsecond', $8, $5, $6, $7` + val("$1", "$2") + `)
` + leaseConflict + `RETURNING fence, attempts, steps, now()`,

		claimLeases: `INSERT INTO ` + t + ` AS i (consumer, key, status, owner, fence, lease_until, attempts, fingerprint, message_id, payload` + col() + `)
SELECT k.consumer, k.key, 'processing', k.owner, 1, now() + k.lease * interval '1 microsecond', k.attempt, k.fp, k.mid, k.payload` + val("k.consumer", "k.key") + `
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bytea[], $6::text[], $7::bytea[], $8::int[]) AS k(consumer, key, owner, lease, fp, mid, payload, attempt)
ORDER BY k.consumer, k.key
` + leaseConflict + `RETURNING i.consumer, i.key, fence, attempts, steps, now()`,

		extendLease: `UPDATE ` + t + ` SET lease_until = LEAST(now() + $5::bigint * interval '1 microsecond', $6::timestamptz), updated_at = now()
WHERE consumer = $1 AND key = $2 AND owner = $3 AND fence = $4 AND status = 'processing'
RETURNING lease_until >= $6::timestamptz, GREATEST(EXTRACT(EPOCH FROM (lease_until - now())), 0)::float8`,

		// The result is coalesced as text: COALESCE($5::json, result)
		// would fail on an inbox whose result column is still jsonb (before
		// migration 00005), as json and jsonb do not coerce implicitly.
		completeWith: `UPDATE ` + t + ` SET status = 'completed', owner = NULL, lease_until = NULL,
	completed_at = now(), updated_at = now(), result = COALESCE($5::text, result::text)::json
WHERE consumer = $1 AND key = $2 AND owner = $3 AND fence = $4 AND status = 'processing'`,

		// The arrays come in (consumer, key) order, and the plan is a nested
		// loop over them with an index scan of the primary key (EXPLAIN on a
		// 200,000-row inbox), so rows are locked in key order like the
		// claims'; were a planner ever to choose otherwise, a deadlock with
		// a claim is mapped to a retry (db_deadlock). Two batches of
		// completions never lock the same row: a row has one owner and fence
		// at a time.
		completeMany: `UPDATE ` + t + ` AS i SET status = 'completed', owner = NULL, lease_until = NULL,
	completed_at = now(), updated_at = now()
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS k(consumer, key, owner, fence)
WHERE i.consumer = k.consumer AND i.key = k.key AND i.owner = k.owner AND i.fence = k.fence
	AND i.status = 'processing'
RETURNING i.consumer, i.key, i.fence`,

		releaseClaim: `UPDATE ` + t + ` SET status = 'failed', owner = NULL, lease_until = NULL,
	last_error = $5, last_failed_at = now(), updated_at = now()
WHERE consumer = $1 AND key = $2 AND owner = $3 AND fence = $4 AND status = 'processing'`,

		adoptClaims: `UPDATE ` + t + ` SET owner_session = $2 WHERE owner_session = $1 AND status = 'processing'`,

		recordStep: `UPDATE ` + t + ` SET steps = steps || jsonb_build_object($5::text, $6::jsonb), updated_at = now()
WHERE consumer = $1 AND key = $2 AND owner = $3 AND fence = $4 AND status = 'processing'`,

		staleForUpdate: `SELECT consumer, key, owner, fence, attempts, last_error, lease_until FROM ` + t + `
WHERE status = 'processing' AND lease_until < now() - $1::bigint * interval '1 microsecond'
ORDER BY lease_until
LIMIT $2
FOR UPDATE SKIP LOCKED`,

		reconcileComplete: `UPDATE ` + t + ` SET status = 'completed', owner = NULL, lease_until = NULL,
	completed_at = now(), updated_at = now()
WHERE consumer = $1 AND key = $2 AND fence = $3 AND status = 'processing'`,

		reconcileRelease: `UPDATE ` + t + ` SET status = $4, owner = NULL, lease_until = NULL,
	last_error = $5, last_failed_at = now(), updated_at = now()
WHERE consumer = $1 AND key = $2 AND fence = $3 AND status = 'processing'`,
	}
	if sessions {
		st.claimLease = withOwnerSession(st.claimLease, "$9")
		st.claimLeases = strings.Replace(withOwnerSession(st.claimLeases, "k.session"),
			"$8::int[]) AS k(consumer, key, owner, lease, fp, mid, payload, attempt)",
			"$8::int[], $9::bigint[]) AS k(consumer, key, owner, lease, fp, mid, payload, attempt, session)", 1)
	}
	// claimLeaseAsync is claimLease committed without waiting for the WAL
	// flush: set_config(…, true) in RETURNING applies to the statement's own
	// implicit transaction, and runs only when a claim was written.
	st.claimLeaseAsync = st.claimLease + `, set_config('synchronous_commit', 'off', true)`
	st.claimLeasesAsync = st.claimLeases + `, set_config('synchronous_commit', 'off', true)`
	// claimOrAbort fails with invalid_text_representation when the claim
	// took no row: the cast's input depends on the aggregate, so the
	// planner cannot fold it, and it runs only in the ELSE branch. Its
	// claim writes the result too, so that the row is written once.
	claimWithResult := `INSERT INTO ` + t + ` AS i (consumer, key, status, fingerprint, message_id, payload, fence, attempts, completed_at, result` + col() + `)
VALUES ($1, $2, 'completed', $3, $4, $5, 1, $6, now(), $7::json` + val("$1", "$2") + `)
` + strings.Replace(conflict, "completed_at = now(),", "completed_at = now(), result = EXCLUDED.result,", 1) + `RETURNING fence`
	claimAllWithResult := `INSERT INTO ` + t + ` AS i (consumer, key, status, fingerprint, message_id, payload, fence, attempts, completed_at, result` + col() + `)
SELECT k.consumer, k.key, 'completed', k.fp, k.mid, k.payload, 1, k.attempt, now(), k.result::json` + val("k.consumer", "k.key") + `
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bytea[], $6::int[], $7::text[]) AS k(consumer, key, fp, mid, payload, attempt, result)
ORDER BY k.consumer, k.key
` + strings.Replace(conflict, "completed_at = now(),", "completed_at = now(), result = EXCLUDED.result,", 1) + `RETURNING i.consumer, i.key, i.fence`
	st.claimAllOrAbort = `WITH c AS (` + claimAllWithResult + `)
SELECT array_agg(c.key ORDER BY c.consumer COLLATE "C", c.key COLLATE "C"),
	CASE WHEN count(*) = $8::int THEN array_agg(c.fence ORDER BY c.consumer COLLATE "C", c.key COLLATE "C")
	ELSE ('inboxmq: keys not free (' || count(*) || ' of ' || $8::int || ' claimed)')::bigint[] END
FROM c`
	st.claimOrAbort = `WITH c AS (` + claimWithResult + `)
SELECT CASE WHEN count(*) = 1 THEN min(c.fence)
	ELSE ('inboxmq: key not free (' || count(*) || ' rows claimed)')::bigint END
FROM c`
	return st
}
