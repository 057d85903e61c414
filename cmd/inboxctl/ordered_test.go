package main

import (
	"encoding/json"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/held"
	"github.com/inboxmq/inboxmq/internal/outboxwire"
)

// A held key as a strict route's worker leaves it: its head's copy and a
// later message wait. list shows it; release and skip act on it, and
// refuse a key that is not held (exit 3) or already releasing (exit 1).
func TestOrderedCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := held.NewStore(b.pool)
	ctx := t.Context()
	head := &amqp.Publishing{MessageId: "ev-2", Headers: amqp.Table{"x-idempotency-key": "acct-1:2"}, Body: []byte(`{"seq":2}`)}
	require.NoError(t, s.Hold(ctx, held.DeadLetter{
		Namespace: "ledger", Queue: "ledger", Exchange: "ledger", Key: "acct-1", MessageID: "ev-2", IdempotencyKey: "acct-1:2",
		Reason: "permanent", Error: "ledger rejects acct-1:2", Copy: head,
	}))
	// A later message of the key arrives while it is held: it is parked
	// behind the head (the dead-letter path parks what is not its head).
	require.NoError(t, s.Hold(ctx, held.DeadLetter{
		Namespace: "ledger", Queue: "ledger", Exchange: "ledger", Key: "acct-1", MessageID: "ev-3",
		Reason: "permanent", Copy: &amqp.Publishing{MessageId: "ev-3", Body: []byte(`{"seq":3}`)},
	}))

	r := b.run(t, "ordered", "--help")
	require.Equal(t, exitOK, r.code, r.errOut)
	for _, sub := range []string{"list", "release", "skip"} {
		require.Regexp(t, `(?m)^  `+sub+`\s`, r.out)
	}

	r = b.run(t, "ordered", "list")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Regexp(t, `(?m)^ledger\s+acct-1\s+held\s+\S+\s+2\s+ev-2\s+permanent\s+ledger rejects acct-1:2$`, r.out)
	r = b.run(t, "ordered", "list", "--namespace", "other", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.JSONEq(t, `[]`, r.out)

	r = b.run(t, "ordered", "release", "acct-9", "--namespace", "ledger")
	require.Equal(t, exitNotFound, r.code, r.out)

	r = b.run(t, "ordered", "skip", "acct-1", "--namespace", "ledger")
	require.Equal(t, exitOK, r.code, r.errOut)
	r = b.run(t, "ordered", "list", "-o", "json")
	var keys []held.Key
	require.NoError(t, json.Unmarshal([]byte(r.out), &keys))
	require.Len(t, keys, 1)
	require.Equal(t, held.StateReleasing, keys[0].State)
	require.False(t, keys[0].HeadParked, "the head was dropped")
	require.Zero(t, keys[0].Parked, "the next message is out")
	var exchange, routingKey string
	var headers, props []byte
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT exchange, routing_key, headers, properties FROM inboxmq_outbox`).
		Scan(&exchange, &routingKey, &headers, &props))
	require.Equal(t, "ledger", exchange)
	require.Equal(t, "acct-1", routingKey)
	h, err := outboxwire.DecodeHeaders(headers)
	require.NoError(t, err)
	require.Equal(t, int64(2), h[held.HeaderSeq], "the message's place in its key's line")
	var pub amqp.Publishing
	require.NoError(t, outboxwire.DecodeProperties(props, &pub))
	require.Equal(t, "ev-3", pub.MessageId)

	r = b.run(t, "ordered", "release", "acct-1", "--namespace", "ledger")
	require.Equal(t, exitFailure, r.code, r.out)
	require.Contains(t, r.errOut, "already being released")
}
