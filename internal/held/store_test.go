package held_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/held"
	"github.com/inboxmq/inboxmq/internal/outboxwire"
	"github.com/inboxmq/inboxmq/internal/pgtest"
)

// out returns the outbox rows of the released messages, by their x-held-seq,
// in the order they were written.
func out(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT headers FROM inboxmq_outbox ORDER BY id`)
	require.NoError(t, err)
	hs, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	require.NoError(t, err)
	seqs := []int64{}
	for _, b := range hs {
		h, err := outboxwire.DecodeHeaders(b)
		require.NoError(t, err)
		seqs = append(seqs, h[held.HeaderSeq].(int64))
	}
	return seqs
}

func waiting(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT seq FROM inboxmq_held_messages ORDER BY seq`)
	require.NoError(t, err)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	if seqs == nil {
		seqs = []int64{}
	}
	return seqs
}

func dead(key, msgID string, seq int64) held.DeadLetter {
	return held.DeadLetter{
		Namespace: "ledger", Queue: "ledger", Exchange: "ledger", Key: key, MessageID: msgID, Seq: seq,
		Reason: "permanent", Error: "rejected " + msgID, Copy: &amqp.Publishing{MessageId: msgID, Body: []byte(msgID)},
	}
}

// A release sends the line out one message at a time, lowest seq first;
// a released message dead-lettered again takes its place back at the head,
// before the messages still waiting; the hold ends after the last.
func TestReleaseKeepsTheLineInOrder(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	s := held.NewStore(pool)
	ctx := t.Context()
	require.NoError(t, s.Hold(ctx, dead("k", "m2", 0)))     // the head: seq 1
	require.NoError(t, s.Hold(ctx, dead("k", "m3", 0)))     // not the head: parked, seq 2
	require.NoError(t, s.Hold(ctx, dead("k", "m2", 0)))     // the head again: its error only
	require.NoError(t, s.Hold(ctx, dead("other", "x1", 0))) // another key
	require.Equal(t, []int64{1, 1, 2}, waiting(t, pool), "other's head, then k's line")
	require.ErrorIs(t, s.Skip(ctx, "ledger", "nobody"), held.ErrNotHeld)

	require.NoError(t, s.Release(ctx, "ledger", "k"))
	require.Equal(t, []int64{1}, out(t, pool), "the head first, alone")
	require.ErrorIs(t, s.Release(ctx, "ledger", "k"), held.ErrReleasing)

	// The head's copy fails for good again: held again at seq 1, m3 still
	// waiting behind it.
	require.NoError(t, s.Hold(ctx, dead("k", "m2", 1)))
	keys, err := s.List(ctx, "ledger")
	require.NoError(t, err)
	require.Len(t, keys, 2)
	k := keys[0]
	require.Equal(t, "k", k.Key)
	require.Equal(t, held.StateHeld, k.State)
	require.True(t, k.HeadParked)
	require.Equal(t, 2, k.Parked)

	require.NoError(t, s.Release(ctx, "ledger", "k"))
	require.Equal(t, []int64{1, 1}, out(t, pool), "the head again")
	require.NoError(t, s.Advance(ctx, "ledger", "k", 2), "not the seq out: nothing")
	require.Equal(t, []int64{1, 1}, out(t, pool))
	require.NoError(t, s.Advance(ctx, "ledger", "k", 1))
	require.Equal(t, []int64{1, 1, 2}, out(t, pool), "then m3")
	require.NoError(t, s.Advance(ctx, "ledger", "k", 1), "a redelivery of the head: nothing")
	require.Equal(t, []int64{1, 1, 2}, out(t, pool))
	require.NoError(t, s.Advance(ctx, "ledger", "k", 2))
	keys, err = s.List(ctx, "ledger")
	require.NoError(t, err)
	require.Len(t, keys, 1, "k's hold ended after its last message")
	require.Equal(t, "other", keys[0].Key)
}

// A skip drops the head's copy and releases the next message.
func TestSkipDropsTheHead(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t)
	s := held.NewStore(pool)
	ctx := t.Context()
	require.NoError(t, s.Hold(ctx, dead("k", "m2", 0)))
	require.NoError(t, s.Hold(ctx, dead("k", "m3", 0)))
	require.NoError(t, s.Skip(ctx, "ledger", "k"))
	require.Equal(t, []int64{2}, out(t, pool), "m3, not the head")
	require.Equal(t, []int64{}, waiting(t, pool))
}
