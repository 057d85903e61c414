package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/retry"
)

func TestMapError(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code, Message: "x"}) }
	plain := errors.New("plain")
	tests := []struct {
		name   string
		err    error
		kind   retry.Kind
		reason string
		source string
	}{
		{"serialization", pg("40001"), retry.KindRetry, inbox.ReasonDBSerialization, ""},
		{"deadlock", pg("40P01"), retry.KindRetry, inbox.ReasonDBDeadlock, ""},
		{"admin shutdown", pg("57P01"), retry.KindRetry, inbox.ReasonDBConnection, ""},
		{"crash shutdown", pg("57P02"), retry.KindRetry, inbox.ReasonDBConnection, ""},
		{"cannot connect now", pg("57P03"), retry.KindRetry, inbox.ReasonDBConnection, ""},
		{"too many connections", pg("53300"), retry.KindRetry, inbox.ReasonDBConnection, ""},
		{"connection failure", pg("08006"), retry.KindRetry, inbox.ReasonDBConnection, ""},
		{"query canceled", pg("57014"), retry.KindRetry, inbox.ReasonDBTimeout, ""},
		{"lock not available", pg("55P03"), retry.KindRetry, inbox.ReasonDBTimeout, ""},
		{"read only", pg("25006"), retry.KindRetry, inbox.ReasonDBReadOnly, ""},
		{"business unique", pg("23505"), retry.KindDuplicate, "duplicate", retry.SourceBusiness},
		{"invalid byte sequence (a NUL)", pg("22021"), retry.KindPermanent, inbox.ReasonDBDataException, ""},
		{"invalid text representation", pg("22P02"), retry.KindPermanent, inbox.ReasonDBDataException, ""},
		{"string too long", pg("22001"), retry.KindPermanent, inbox.ReasonDBDataException, ""},
		{"numeric out of range", pg("22003"), retry.KindPermanent, inbox.ReasonDBDataException, ""},
		{"not null violation", pg("23502"), retry.KindPermanent, inbox.ReasonDBIntegrityViolation, ""},
		{"foreign key violation", pg("23503"), retry.KindPermanent, inbox.ReasonDBIntegrityViolation, ""},
		{"check violation", pg("23514"), retry.KindPermanent, inbox.ReasonDBIntegrityViolation, ""},
		{"check violation with its constraint's name", &pgconn.PgError{Code: "23514", ConstraintName: "inboxmq_inbox_status_check",
			Message: `new row for relation "inboxmq_inbox" violates check constraint "inboxmq_inbox_status_check"`, Routine: "ExecConstraints"},
			retry.KindPermanent, inbox.ReasonDBIntegrityViolation, ""},
		{"no partition for the row", fmt.Errorf("inbox: claim: %w", &pgconn.PgError{Code: "23514", TableName: "inboxmq_inbox",
			Message: `no partition of relation "inboxmq_inbox" found for row`, Routine: "ExecFindPartition"}),
			retry.KindRetry, inbox.ReasonDBNoPartition, ""},
		{"no partition, message in another language", &pgconn.PgError{Code: "23514", TableName: "inboxmq_inbox",
			Message: `keine Partition von Relation »inboxmq_inbox« für die Zeile gefunden`, Routine: "ExecFindPartition"},
			retry.KindRetry, inbox.ReasonDBNoPartition, ""},
		{"no partition's text on a named constraint", &pgconn.PgError{Code: "23514", ConstraintName: "c",
			Message: `no partition of relation "t" found for row`}, retry.KindPermanent, inbox.ReasonDBIntegrityViolation, ""},
		{"partition constraint (a row in the wrong partition)", &pgconn.PgError{Code: "23514",
			Message: `new row for relation "inboxmq_inbox_p1" violates partition constraint`, Routine: "ExecPartitionCheckEmitError"},
			retry.KindPermanent, inbox.ReasonDBIntegrityViolation, ""},
		{"exclusion violation", pg("23P01"), retry.KindPermanent, inbox.ReasonDBIntegrityViolation, ""},
		{"undefined table passes through", pg("42P01"), retry.KindRetry, retry.ReasonError, ""},
		{"net error", &net.OpError{Op: "read", Err: errors.New("reset")}, retry.KindRetry, inbox.ReasonDBConnection, ""},
		{"connection lost (EOF)", fmt.Errorf("failed to receive message: %w", io.ErrUnexpectedEOF), retry.KindRetry, inbox.ReasonDBConnection, ""},
		{"connection closed", fmt.Errorf("begin: %w", pgconn.ErrConnClosed), retry.KindRetry, inbox.ReasonDBConnection, ""},
		{"every host refused (fail-over under way)", fmt.Errorf("connect: %w", inbox.ErrReplica), retry.KindRetry, inbox.ReasonDBReadOnly, ""},
		{"handler permanent passes through", retry.Permanent(pg("40001")), retry.KindPermanent, retry.ReasonPermanent, ""},
		{"handler retry passes through", retry.WithReason("gw", retry.Retryable(plain)), retry.KindRetry, "gw", ""},
		{"deadline passes through", context.DeadlineExceeded, retry.KindRetry, retry.ReasonTimeout, ""},
		{"plain passes through", plain, retry.KindRetry, retry.ReasonError, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := inbox.MapError(tt.err)
			require.ErrorIs(t, got, tt.err)
			d := retry.Classify(got)
			require.Equal(t, tt.kind, d.Kind)
			require.Equal(t, tt.reason, d.Reason)
			require.Equal(t, tt.source, d.Source)
		})
	}
	require.NoError(t, inbox.MapError(nil))
}
