package consumer

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestSettleFailures_GrowForgetAndStayBounded(t *testing.T) {
	t.Parallel()
	var f settleFailures
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	a := &amqp.Delivery{MessageId: "m", Body: []byte("a")}
	sameIDOtherBody := &amqp.Delivery{MessageId: "m", Body: []byte("b")}

	wait, n := f.hold("q", a, now)
	require.Zero(t, wait, "nothing remembered: no wait")
	require.Zero(t, n)
	for i := 1; i <= 12; i++ {
		w := f.record(identify("q", a), 0, now)
		base := min(100*time.Millisecond<<min(i-1, 9), 30*time.Second)
		require.GreaterOrEqual(t, w, base/2, "failure %d", i)
		require.Less(t, w, base*3/2, "failure %d", i)
		held, count := f.hold("q", a, now)
		require.Equal(t, w, held)
		require.Equal(t, i, count)
	}
	held, _ := f.hold("q", a, now.Add(time.Hour))
	require.Zero(t, held, "the delay passed")
	held, _ = f.hold("q", sameIDOtherBody, now)
	require.Zero(t, held, "another body is another message")
	held, _ = f.hold("other", a, now)
	require.Zero(t, held, "another queue is another delivery")

	require.GreaterOrEqual(t, f.record(identify("q", a), 5, now), 800*time.Millisecond, "the route's streak raises the count")
	_, n = f.hold("q", a, now)
	require.Equal(t, 13, n)

	// Back long after its last delay: it starts again from scratch.
	later := now.Add(time.Hour)
	require.Less(t, f.record(identify("q", a), 0, later), 150*time.Millisecond)
	f.forget("q", a)
	_, n = f.hold("q", a, later)
	require.Zero(t, n, "forgotten once settled")

	for i := range maxSettleFailures + 100 {
		f.record(identify("q", &amqp.Delivery{Body: []byte(fmt.Sprint(i))}), 0, later.Add(time.Duration(i)*time.Millisecond))
	}
	require.Len(t, f.m, maxSettleFailures, "bounded")
	_, n = f.hold("q", &amqp.Delivery{Body: []byte("0")}, later)
	require.Zero(t, n, "the oldest went first")
	_, n = f.hold("q", &amqp.Delivery{Body: []byte(fmt.Sprint(maxSettleFailures + 99))}, later)
	require.Equal(t, 1, n)
}
