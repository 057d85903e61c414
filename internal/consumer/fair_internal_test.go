package consumer

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// The next slot goes to the waiting tenant with the fewest running
// deliveries for its weight, the earliest arrival on a tie; a tenant alone
// takes every slot.
func TestFairShareChoosesByRunningPerWeight(t *testing.T) {
	t.Parallel()
	f := newFairShare(map[string]int{"b": 3})
	push := func(tenant string, tag uint64) { f.push(job{key: tenant, raw: amqp.Delivery{DeliveryTag: tag}}) }
	grant := func() string {
		j, ok := f.next()
		require.True(t, ok)
		f.start(j.key)
		f.pop(j.key)
		return j.key
	}
	for i := range 10 {
		push("a", uint64(i))
	}
	for range 4 {
		require.Equal(t, "a", grant(), "alone, a takes every slot")
	}
	for i := range 10 {
		push("b", uint64(100+i))
	}
	var got []string
	for range 4 { // a holds 4: each freed slot of a's goes to b until b holds 3
		f.done("a")
		got = append(got, grant())
	}
	require.Equal(t, []string{"b", "b", "b", "a"}, got)
	f.done("b")
	require.Equal(t, "b", grant(), "b below its share of 3 for 1")
	f.done("a")
	require.Equal(t, "a", grant(), "a at 0 running: (0+1)/1 = (3+1)/3 is no better for b, and a waited longer")

	j, _ := f.next()
	require.Equal(t, "b", j.key, "a at 1 for 1, b at 3 for 3")
	require.Equal(t, uint64(104), j.raw.DeliveryTag, "a tenant's deliveries go in arrival order")
	left := f.drain()
	require.Len(t, left, 4+6, "a: 10 less 6 granted; b: 10 less 4")
	_, ok := f.next()
	require.False(t, ok)
}
