package observe_test

import (
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/metrics"
	"github.com/inboxmq/inboxmq/internal/observe"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

type job struct {
	ID string `json:"id"`
}

func (j job) IdempotencyKey() string { return "job:" + j.ID }

// gateObserver holds the consumer's supervisor on a disconnection until the
// test has looked at /readyz, so the reconnect cannot race the check.
type gateObserver struct {
	inboxtype.NopObserver
	disconnected chan struct{}
	connected    chan struct{}
	gate         chan struct{}
	settled      chan inboxtype.Action
}

func (g *gateObserver) OnConnState(s inboxtype.ConnState, _ error) {
	switch s {
	case inboxtype.ConnDisconnected:
		g.disconnected <- struct{}{}
		<-g.gate
	case inboxtype.ConnConnected:
		g.connected <- struct{}{}
	}
}

func (g *gateObserver) OnOutcome(_ *inboxtype.Delivery, o inboxtype.Outcome) { g.settled <- o.Action }

// closeConnection closes, from the server side, the connection named name.
func closeConnection(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testenv.Timeout())
	defer cancel()
	var pid string
	testenv.WaitFor(t, "connection "+name+" listed", func() bool {
		out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "list_connections", "pid", "client_properties").CombinedOutput()
		require.NoError(t, err, "rabbitmqctl list_connections: %s", out)
		for line := range strings.SplitSeq(string(out), "\n") {
			if strings.Contains(line, `"`+name+`"`) {
				pid = strings.Fields(line)[0]
				return true
			}
		}
		return false
	})
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "close_connection", pid, "inboxmq test: cut").CombinedOutput()
	require.NoError(t, err, "rabbitmqctl close_connection: %s", out)
}

func TestReadyz_RealConsumerLosesBroker(t *testing.T) {
	t.Parallel()
	conn := amqptest.Dial(t)
	queue := amqptest.QueueName(t)
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, nil)
	require.NoError(t, err)
	m.Init(queue, queue)
	gate := &gateObserver{
		disconnected: make(chan struct{}, 1), connected: make(chan struct{}, 4),
		gate: make(chan struct{}), settled: make(chan inboxtype.Action, 4),
	}

	r := consumer.NewRouter()
	consumer.Register(r, queue, inboxtype.HandlerFunc[job](func(context.Context, *inboxtype.Message[job]) error {
		return nil
	}), nil)
	name := "inboxmq-test-observe-" + queue
	c, err := consumer.New(&consumer.Config{
		URL: testenv.AMQPURL(), Name: name, Router: r,
		Observers:                []inboxtype.Observer{m, gate},
		ReconnectInitialInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)

	srv := observe.NewServer(&observe.ServerConfig{
		Addr: "127.0.0.1:0", Gatherer: reg,
		Checks: []observe.Check{observe.Ready("broker", c.Ready), observe.DegradedFlag("redis", m.RedisDegraded)},
	})
	require.NoError(t, srv.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, srv.Stop(context.Background())) })
	b := &testBundle{srv: srv, client: &http.Client{}}

	code, _ := b.get(t, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "not started: not ready")

	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
		defer cancel()
		require.NoError(t, c.Stop(ctx))
	})
	testenv.WaitChan(t, gate.connected, "first connection")
	code, body := b.get(t, "/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.InDelta(t, 1, testutil.ToFloat64(gaugeOf(t, reg, "inboxmq_broker_connected")), 0)

	// One delivery moves the real consumer's metrics.
	amqptest.NewPublisher(t, conn).Publish(queue, []byte(`{"id":"1"}`), amqp.Publishing{MessageId: "m-1"})
	require.Equal(t, inboxtype.ActionAcked, testenv.WaitChan(t, gate.settled, "the delivery settles"))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP inboxmq_deliveries_received_total Deliveries received from the broker.
# TYPE inboxmq_deliveries_received_total counter
inboxmq_deliveries_received_total{consumer="`+queue+`",queue="`+queue+`"} 1
`), "inboxmq_deliveries_received_total"))

	closeConnection(t, name)
	testenv.WaitChan(t, gate.disconnected, "the consumer notices the cut")
	code, body = b.get(t, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "broker cut: not ready")
	require.Contains(t, body, `"broker":{"ok":false`)
	require.Zero(t, testutil.ToFloat64(gaugeOf(t, reg, "inboxmq_broker_connected")))

	close(gate.gate)
	testenv.WaitChan(t, gate.connected, "reconnected")
	code, _ = b.get(t, "/readyz")
	require.Equal(t, http.StatusOK, code, "ready again after the reconnect")
	require.InDelta(t, 1, testutil.ToFloat64(gaugeOf(t, reg, "inboxmq_broker_reconnects_total")), 0)
}

// gaugeOf returns a collector reading the unlabelled series name.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "v", Help: "v"}, func() float64 { return v })
		}
	}
	t.Fatalf("no series %s", name)
	return nil
}
