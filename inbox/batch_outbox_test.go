package inbox_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/outboxwire"
	"github.com/inboxmq/inboxmq/outbox"
)

// statementTracer counts round trips and records each batch statement.
type statementTracer struct {
	countingTracer
	mu   sync.Mutex
	sqls []string
}

func (s *statementTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sqls = append(s.sqls, d.SQL)
}

// outboxInserts counts the recorded statements that write the outbox.
func (s *statementTracer) outboxInserts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, q := range s.sqls {
		if strings.HasPrefix(q, "INSERT INTO inboxmq_outbox") {
			n++
		}
	}
	return n
}

// A group's deliveries write their events (outbox.AddToBatch) in one
// statement, in the group's order, each row as a delivery of its own would
// write it: headers with their types, the ordering key only where one was
// given, the idempotency key.
func TestBatchHandler_GroupWritesItsEventsInOneStatement(t *testing.T) {
	t.Parallel()
	tr := &statementTracer{}
	b := setupOn(t, tracedPool(t, tr), nil)
	withEvent := func(_ context.Context, batch *pgx.Batch, msg *inboxtype.Message[order]) error {
		batch.Queue(`INSERT INTO effects (key, amount) VALUES ($1, $2)`, msg.Key, msg.Body.Amount)
		m := outbox.Message{
			Exchange: "events", RoutingKey: "payment.completed", IdempotencyKey: msg.Key,
			ContentType: "application/json", Body: []byte(`{"order":"` + msg.Body.OrderID + `"}`),
			Headers: amqp.Table{"amount": int32(msg.Body.Amount), "source": "test"},
		}
		if msg.Body.Amount%2 == 1 {
			m.OrderingKey = "customer-" + msg.Body.OrderID
		}
		return outbox.AddToBatch(context.Background(), batch, m)
	}
	msgs := orders(t, 8)
	for i, err := range handleAll(t, inbox.BatchHandler(b.store, withEvent, fullBatch(len(msgs))), msgs) {
		require.NoError(t, err, "delivery %d", i)
	}
	require.Equal(t, 1, tr.outboxInserts(), "one statement for the group's events")
	// A delivery on its own writes its event as before.
	alone := newMsg(t, "payments", order{OrderID: "9", Amount: 9}, false)
	require.NoError(t, inbox.BatchHandler(b.store, withEvent, nil).Handle(t.Context(), alone))
	require.Equal(t, 2, tr.outboxInserts())

	rows, err := b.pool.Query(t.Context(), `SELECT message_id, exchange, routing_key, headers::text, content_type, body, ordering_key, idempotency_key
FROM inboxmq_outbox ORDER BY id`)
	require.NoError(t, err)
	type row struct {
		id, exchange, routingKey, headers, contentType string
		body                                           []byte
		orderingKey, idempotencyKey                    *string
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var o row
		err := r.Scan(&o.id, &o.exchange, &o.routingKey, &o.headers, &o.contentType, &o.body, &o.orderingKey, &o.idempotencyKey)
		return o, err
	})
	require.NoError(t, err)
	require.Len(t, got, 9)
	// The group ran in key order ("order:1" … "order:8"), then the ninth.
	for i, r := range got {
		n := i + 1
		key := order{OrderID: string(rune('0' + n))}.IdempotencyKey()
		require.Equal(t, outbox.DeriveID("events", "payment.completed", key), r.id, "row %d", i)
		require.Equal(t, "events", r.exchange)
		require.Equal(t, "payment.completed", r.routingKey)
		require.Equal(t, "application/json", r.contentType)
		require.JSONEq(t, `{"order":"`+string(rune('0'+n))+`"}`, string(r.body))
		require.NotNil(t, r.idempotencyKey)
		require.Equal(t, key, *r.idempotencyKey)
		if n%2 == 1 {
			require.NotNil(t, r.orderingKey, "row %d", i)
			require.Equal(t, "customer-"+string(rune('0'+n)), *r.orderingKey)
		} else {
			require.Nil(t, r.orderingKey, "row %d: no ordering key is NULL", i)
		}
		var raw json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(r.headers), &raw), "headers are JSON")
		h, err := outboxwire.DecodeHeaders([]byte(r.headers))
		require.NoError(t, err)
		require.Equal(t, int32(n), h["amount"], "row %d keeps the header's type", i)
		require.Equal(t, "test", h["source"])
		require.Equal(t, key, h[inboxtype.HeaderIdempotencyKey])
	}
}
