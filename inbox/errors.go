package inbox

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxmq/inboxmq/retry"
)

// ErrLeaseLost is the cause with which a claim handler's context is
// cancelled when its lease could not be extended (another worker took the
// claim over, the database was unreachable) or reached ClaimOpts.MaxLease.
var ErrLeaseLost = errors.New("inbox: lease lost")

// ErrNotFound is returned by [Store.Get] when the inbox has no row for the
// key.
var ErrNotFound = errors.New("inbox: record not found")

// ErrReplica is returned by [Store.Check] when the pool points at a read
// replica (or a read-only session): replicas lag, so the final "was this
// done?" check must run on the primary.
var ErrReplica = errors.New("inbox: the database is a read replica or read-only; the inbox needs the primary (replicas lag, so the final check must be on the primary)")

// ErrNotChecked is returned by a [Store] used before [Store.Check] passed.
var ErrNotChecked = errors.New("inbox: store not checked yet (Store.Check; a worker's Start runs it)")

// ErrNoTable is returned by [Store.Check] when the inbox table is missing.
var ErrNoTable = errors.New("inbox: inbox table not found; run the migrations first (migrations.Up)")

// Reasons given to database errors mapped into the retry taxonomy. They are
// bounded and so safe as metric labels.
const (
	ReasonDBSerialization = "db_serialization" // SQLSTATE 40001
	ReasonDBDeadlock      = "db_deadlock"      // SQLSTATE 40P01
	ReasonDBConnection    = "db_connection"    // shutdown, connection loss, too many connections
	ReasonDBTimeout       = "db_timeout"       // statement or lock timeout
	ReasonDBReadOnly      = "db_read_only"     // a write reached a read-only server (fail-over)
	ReasonDBCommit        = "db_commit"        // COMMIT failed
	// ReasonDBDataException: PostgreSQL refused a value (SQLSTATE class 22,
	// such as a NUL byte in a text column or a number out of range).
	ReasonDBDataException = "db_data_exception"
	// ReasonDBIntegrityViolation: a write broke a constraint (SQLSTATE
	// class 23: not null, foreign key, check, exclusion) other than a
	// unique one, which is a duplicate, and a missing partition
	// (ReasonDBNoPartition).
	ReasonDBIntegrityViolation = "db_integrity_violation"
	ReasonClaimHeld            = "claim_held" // another worker holds a live claim
	ReasonLeaseLost            = "lease_lost" // the claim's lease was lost or reached its cap
	ReasonCrashLoop            = "crash_loop" // redelivered more than StoreConfig.CrashLimit times
	// ReasonKeyDead: a new delivery of a key that was dead-lettered, which
	// its route rejects (inboxmq.RouteOpts.AfterDead); the key's row keeps
	// the error it died of.
	ReasonKeyDead = "key_dead"

	// ReasonDBNoPartition: a partitioned table has no partition for the
	// row (SQLSTATE 23514 "no partition of relation … found for row"): the
	// partitions ahead of a partitioned inbox ran out. The database's
	// fault, not the message's, so it is retried; the store creates the
	// missing partitions of its inbox table where its role may.
	ReasonDBNoPartition = "db_no_partition"
)

// classified reports whether err already carries a decision of the retry
// taxonomy (the handler's own Permanent, After, Duplicate, Interrupted or
// key-conflict errors), which the inbox passes through unchanged.
func classified(err error) bool {
	var (
		perm *retry.PermanentError
		rt   *retry.RetryableError
		dup  *retry.DuplicateError
		intr *retry.InterruptedError
	)
	return errors.As(err, &perm) || errors.As(err, &rt) || errors.As(err, &dup) ||
		errors.As(err, &intr) || errors.Is(err, retry.ErrDuplicate) || errors.Is(err, retry.ErrKeyConflict)
}

// MapError maps a database error into the retry taxonomy, so that package
// retry stays free of pgx. Errors that are already classified pass through,
// as does a nil error. The mapping:
//
//   - 40001 serialization_failure → retryable, reason db_serialization;
//   - 40P01 deadlock_detected → retryable, reason db_deadlock;
//   - 57P01/57P02/57P03 (shutdown), 53300 (too many connections), class 08
//     (connection exception), a failed connection attempt, a connection
//     that broke or was closed (pgconn.SafeToRetry, net errors, an
//     unexpected EOF) → retryable, reason db_connection;
//   - 57014 query_canceled, 55P03 lock_not_available and pgconn.Timeout →
//     retryable, reason db_timeout (unless the caller's context ended: that
//     error passes through so the consumer can read the cause);
//   - 25006 read_only_sql_transaction, and [ErrReplica] (every host of a
//     pool built through [ConfigurePool] is a standby or read-only: a
//     fail-over under way) → retryable, reason db_read_only;
//   - 23505 unique_violation → duplicate with source business_constraint (the
//     inbox's own key never raises it);
//   - 23514 without a constraint name, raised because a partitioned table
//     has no partition for the row ("no partition of relation … found for
//     row") → retryable, reason db_no_partition: the partitions ahead ran
//     out, which creating them fixes (a CHECK constraint's violation names
//     its constraint and stays permanent);
//   - class 22 (data exception: a NUL byte or invalid text in a text
//     column, a value out of range) → permanent, reason db_data_exception;
//   - the rest of class 23 (integrity constraint violation: not null,
//     foreign key, check, exclusion) → permanent, reason
//     db_integrity_violation;
//   - anything else passes through unchanged (the retry policy bounds it).
//
// Classes 22 and 23 are permanent wherever they come from, the inbox's own
// statements included (a key PostgreSQL cannot store fails the claim):
// the same values fail the same way on every attempt.
func MapError(err error) error {
	m, _ := mapError(err)
	return m
}

// mapError is MapError that also reports whether err was mapped (or was
// already classified).
func mapError(err error) (error, bool) {
	if err == nil || classified(err) {
		return err, true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "40001":
			return retry.WithReason(ReasonDBSerialization, retry.Retryable(err)), true
		case pgErr.Code == "40P01":
			return retry.WithReason(ReasonDBDeadlock, retry.Retryable(err)), true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", pgErr.Code == "53300",
			sqlClass(pgErr.Code) == "08":
			return retry.WithReason(ReasonDBConnection, retry.Retryable(err)), true
		case pgErr.Code == "57014", pgErr.Code == "55P03":
			return retry.WithReason(ReasonDBTimeout, retry.Retryable(err)), true
		case pgErr.Code == "25006":
			return retry.WithReason(ReasonDBReadOnly, retry.Retryable(err)), true
		case pgErr.Code == "23505":
			return retry.Duplicate(retry.SourceBusiness, err), true
		case noPartition(pgErr):
			return retry.WithReason(ReasonDBNoPartition, retry.Retryable(err)), true
		case sqlClass(pgErr.Code) == "22":
			return retry.WithReason(ReasonDBDataException, retry.Permanent(err)), true
		case sqlClass(pgErr.Code) == "23":
			return retry.WithReason(ReasonDBIntegrityViolation, retry.Permanent(err)), true
		}
	}
	if errors.Is(err, ErrReplica) {
		// Every host of the pool's URL was refused (ConfigurePool): the
		// fail-over has not promoted a primary yet.
		return retry.WithReason(ReasonDBReadOnly, retry.Retryable(err)), true
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return retry.WithReason(ReasonDBConnection, retry.Retryable(err)), true
	}
	if pgErr != nil {
		return err, false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err, true
	}
	if pgconn.Timeout(err) {
		return retry.WithReason(ReasonDBTimeout, retry.Retryable(err)), true
	}
	var netErr net.Error
	if pgconn.SafeToRetry(err) || errors.As(err, &netErr) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return retry.WithReason(ReasonDBConnection, retry.Retryable(err)), true
	}
	return err, false
}

// isPermanent reports whether err, mapped, fails permanently: the same
// statement would fail the same way again.
func isPermanent(err error) bool {
	var perm *retry.PermanentError
	return errors.As(MapError(err), &perm)
}

// noPartition reports whether pgErr is PostgreSQL's refusal of a row for
// which a partitioned table has no partition (ExecFindPartition): SQLSTATE
// 23514 like a CHECK violation, but naming no constraint. The routine's
// name identifies it whatever the server's lc_messages; the message
// identifies it from a server that sends no routine.
func noPartition(pgErr *pgconn.PgError) bool {
	return pgErr.Code == "23514" && pgErr.ConstraintName == "" &&
		(pgErr.Routine == "ExecFindPartition" || strings.HasPrefix(pgErr.Message, "no partition of relation "))
}

// sqlClass is the class of a SQLSTATE (its first two characters), or ""
// for a malformed code.
func sqlClass(code string) string {
	if len(code) != 5 {
		return ""
	}
	return code[:2]
}

// infraError maps an error of the inbox's own statements (begin, claim,
// commit): like MapError, but anything unmapped is retryable with reason,
// since the job itself did not fail.
func infraError(reason string, err error) error {
	if m, ok := mapError(err); ok {
		return m
	}
	return retry.WithReason(reason, retry.Retryable(err))
}
