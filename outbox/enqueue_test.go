package outbox

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestPrepareValidates(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		msg  Message
		want error
	}{
		"no destination": {Message{ID: "x"}, ErrNoDestination},
		"no id or key":   {Message{RoutingKey: "q"}, ErrNoID},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := prepare(t.Context(), tc.msg)
			require.ErrorIs(t, err, tc.want)
		})
	}
	r, err := prepare(t.Context(), Message{Exchange: "ex", ID: "given"})
	require.NoError(t, err)
	require.Equal(t, "given", r.id)
}

func TestDeriveID(t *testing.T) {
	t.Parallel()
	id := DeriveID("ex", "rk", "key-1")
	require.Equal(t, id, DeriveID("ex", "rk", "key-1"), "stable")
	require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id)
	require.NotEqual(t, id, DeriveID("ex", "rk2", "key-1"), "destination matters")
	require.NotEqual(t, DeriveID("a", "bc", "k"), DeriveID("ab", "c", "k"), "fields are length-prefixed")
}

// TestAddToBatchValidatesBeforeAdding leaves the batch unchanged when a
// message is invalid.
func TestAddToBatchValidatesBeforeAdding(t *testing.T) {
	t.Parallel()
	batch := &pgx.Batch{}
	batch.Queue("SELECT 1")
	err := AddToBatch(context.Background(), batch, Message{RoutingKey: "q", IdempotencyKey: "k"}, Message{IdempotencyKey: "k"})
	require.ErrorIs(t, err, ErrNoDestination)
	require.Equal(t, 1, batch.Len())
	require.Error(t, AddToBatch(context.Background(), nil, Message{RoutingKey: "q", IdempotencyKey: "k"}))
	require.NoError(t, AddToBatch(context.Background(), batch))
	require.Equal(t, 1, batch.Len())
}

// BenchmarkAddToBatch measures what a handler pays to enqueue one event
// in its batch (the id, the headers, the queued statements), without
// PostgreSQL.
func BenchmarkAddToBatch(b *testing.B) {
	ctx := b.Context()
	msg := Message{
		Exchange: "payments.events", RoutingKey: "payment.completed", IdempotencyKey: "order-1234567",
		ContentType: "application/json", Body: []byte(`{"order_id":"order-1234567","amount_cents":1250,"currency":"EUR","status":"completed"}`),
	}
	b.ReportAllocs()
	for b.Loop() {
		batch := &pgx.Batch{}
		if err := AddToBatch(ctx, batch, msg); err != nil {
			b.Fatal(err)
		}
	}
}
