package middleware_test

import (
	"bytes"
	"context"
	"encoding/json"

	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/clip"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/metrics"
	"github.com/inboxmq/inboxmq/middleware"
	"github.com/inboxmq/inboxmq/retry"
)

// loggedPayment is the payload of the consumer-level log tests.
type loggedPayment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

func (p loggedPayment) IdempotencyKey() string { return "payment:" + p.OrderID }

// lockedBuffer collects the JSON log lines of one test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) Sync() error { return nil }

// lines returns every line written so far, each with its parsed fields.
func (b *lockedBuffer) lines(t *testing.T) (raw []string, parsed []map[string]any) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for line := range strings.Lines(b.buf.String()) {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "a JSON log line")
		raw, parsed = append(raw, line), append(parsed, m)
	}
	return raw, parsed
}

// outcomes hands each settled outcome to the test; it is the last observer,
// so the other observers have written their lines by then.
type outcomes struct {
	consumer.NopObserver
	ch chan consumer.Outcome
}

func (o *outcomes) OnOutcome(_ *consumer.Delivery, out consumer.Outcome) { o.ch <- out }

// consumerLogBundle is one consumer-level test: a route on its own queue, a
// consumer whose observers are the metrics, the log observer (writing
// JSON through zap's production configuration, stack traces at error
// level included) and the outcome channel.
type consumerLogBundle struct {
	queue    string
	conn     *amqp.Connection
	pub      *amqptest.Publisher
	logs     *lockedBuffer
	reg      *prometheus.Registry
	outcomes chan consumer.Outcome
}

func setupConsumerLog(t *testing.T, h consumer.Handler[loggedPayment], opts *consumer.HandlerOpts) *consumerLogBundle {
	t.Helper()
	b := &consumerLogBundle{
		queue:    amqptest.QueueName(t),
		conn:     amqptest.Dial(t),
		logs:     &lockedBuffer{},
		reg:      prometheus.NewRegistry(),
		outcomes: make(chan consumer.Outcome, 16),
	}
	b.pub = amqptest.NewPublisher(t, b.conn)
	zcfg := zap.NewProductionConfig()
	zcfg.Sampling = nil
	logger, err := zcfg.Build(zap.WrapCore(func(zapcore.Core) zapcore.Core {
		return zapcore.NewCore(zapcore.NewJSONEncoder(zcfg.EncoderConfig), b.logs, zapcore.DebugLevel)
	}))
	require.NoError(t, err)
	m, err := metrics.New(b.reg, nil)
	require.NoError(t, err)

	r := consumer.NewRouter()
	r.Use(middleware.Recover(&middleware.RecoverOpts{Logger: logger}))
	consumer.Register(r, b.queue, h, opts)
	c, err := consumer.New(&consumer.Config{
		URL:       testenv.AMQPURL(),
		Router:    r,
		Logger:    logger,
		Observers: []consumer.Observer{m, middleware.NewLogObserver(logger, &middleware.LogOpts{SampleFirst: -1}), &outcomes{ch: b.outcomes}},
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
	return b
}

// counter returns the value of the inboxmq_<name> series with the label.
func (b *consumerLogBundle) counter(t *testing.T, name, label, value string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "inboxmq_"+name {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if s.GetCounter() != nil {
						return s.GetCounter().GetValue()
					}
					return s.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// linesWith returns the parsed lines whose status is status.
func linesWith(parsed []map[string]any, status string) []map[string]any {
	var out []map[string]any
	for _, m := range parsed {
		if m["status"] == status {
			out = append(out, m)
		}
	}
	return out
}

func waitAction(t *testing.T, ch <-chan consumer.Outcome, want consumer.Action) consumer.Outcome {
	t.Helper()
	for {
		o := testenv.WaitChan(t, ch, "outcome "+string(want))
		if o.Action == want {
			return o
		}
	}
}

// A body whose amount is a 10 MB number makes a 10 MB decode error: every
// log line stays within a few KiB (the error text is cut at 1 KiB, with a
// marker), and the dead-letter line, an expected outcome, carries no stack
// trace even under zap's production configuration.
func TestLogObserver_HugeDecodeErrorIsBoundedWithoutStack(t *testing.T) {
	t.Parallel()
	b := setupConsumerLog(t, consumer.HandlerFunc[loggedPayment](func(context.Context, *consumer.Message[loggedPayment]) error {
		return nil
	}), nil)
	body := []byte(`{"order_id":"huge","amount_cents":` + strings.Repeat("9", 10<<20) + `}`)
	b.pub.Publish(b.queue, body, amqp.Publishing{MessageId: "huge-1"})
	waitAction(t, b.outcomes, consumer.ActionDeadLettered)

	raw, parsed := b.logs.lines(t)
	for i, line := range raw {
		require.Less(t, len(line), 4<<10, "log line %d is bounded: %.300s", i, line)
		require.NotContains(t, parsed[i], "stacktrace", "no stack on %.300s", line)
	}
	dead := linesWith(parsed, consumer.StatusDeadLettered)
	require.Len(t, dead, 1)
	require.Equal(t, retry.ReasonDecode, dead[0]["reason"])
	text, _ := dead[0]["error"].(string)
	require.Len(t, text, clip.Limit)
	require.Contains(t, text, "… [truncated from ")
}
