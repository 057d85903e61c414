package relay

import (
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// A relay given two nodes (two proxies in front of the test broker)
// publishes through one; when that node goes away (its connections cut and
// refused), the lane reconnects to the other and the rows still go out,
// and OnBrokerNode reports the move.
func TestRelayFailsOverToAnotherNode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	px := map[string]*proxy{}
	var urls []string
	for range 2 {
		p := newProxy(t, true)
		u, err := url.Parse(p.URL())
		require.NoError(t, err)
		px[u.Host] = p
		urls = append(urls, p.URL())
	}
	var mu sync.Mutex
	var events []string
	on := map[string]bool{}
	hook := func(role, node string, connected bool) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, role+" "+node+" "+strconv.FormatBool(connected))
		on[node] = connected
	}
	current := func() string {
		mu.Lock()
		defer mu.Unlock()
		for n, c := range on {
			if c {
				return n
			}
		}
		return ""
	}
	r, _ := b.newRelay(t, &Config{
		URL: urls[0] + "," + urls[1], Concurrency: 1, BatchSize: 5, OnBrokerNode: hook,
		StatsInterval: 10 * time.Millisecond,
	})
	start(t, r)
	for i := range 5 {
		enqueue(t, b.pool, msgTo(b.queue, "a"+strconv.Itoa(i)))
	}
	waitAllSent(t, b.pool, 5)
	first := current()
	require.Contains(t, px, first)

	px[first].setUp(false) // the node is down: its connections cut, new ones refused
	px[first].cut()
	for i := range 5 {
		enqueue(t, b.pool, msgTo(b.queue, "b"+strconv.Itoa(i)))
	}
	waitAllSent(t, b.pool, 10)
	testenv.WaitFor(t, "the lane on the other node", func() bool { n := current(); return n != "" && n != first })
	mu.Lock()
	require.Contains(t, events, "relay "+first+" true")
	require.Contains(t, events, "relay "+first+" false")
	mu.Unlock()
	require.GreaterOrEqual(t, len(amqptest.Drain(t, b.conn, b.queue)), 10, "every row went out (a cut may duplicate, never lose)")
}
