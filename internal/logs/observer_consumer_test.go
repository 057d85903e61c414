package logs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/clip"
	"github.com/inboxmq/inboxmq/internal/consumer"
	logobs "github.com/inboxmq/inboxmq/internal/logs"
	"github.com/inboxmq/inboxmq/internal/metrics"
	"github.com/inboxmq/inboxmq/internal/testenv"
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
	inboxtype.NopObserver
	ch chan inboxtype.Outcome
}

func (o *outcomes) OnOutcome(_ *inboxtype.Delivery, out inboxtype.Outcome) { o.ch <- out }

// consumerLogBundle is one consumer-level test: a route on its own queue, a
// consumer whose observers are the metrics, the log observer (writing
// JSON through slog's JSON handler, every level) and the outcome channel.
type consumerLogBundle struct {
	queue    string
	conn     *amqp.Connection
	pub      *amqptest.Publisher
	logs     *lockedBuffer
	reg      *prometheus.Registry
	outcomes chan inboxtype.Outcome
}

func setupConsumerLog(t *testing.T, h inboxtype.Handler[loggedPayment], opts *consumer.HandlerOpts) *consumerLogBundle {
	t.Helper()
	b := &consumerLogBundle{
		queue:    amqptest.QueueName(t),
		conn:     amqptest.Dial(t),
		logs:     &lockedBuffer{},
		reg:      prometheus.NewRegistry(),
		outcomes: make(chan inboxtype.Outcome, 16),
	}
	b.pub = amqptest.NewPublisher(t, b.conn)
	logger := slog.New(slog.NewJSONHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := metrics.New(b.reg, nil)
	require.NoError(t, err)

	r := consumer.NewRouter()
	consumer.Register(r, b.queue, h, opts)
	c, err := consumer.New(&consumer.Config{
		URL:       testenv.AMQPURL(),
		Router:    r,
		Logger:    logger,
		Observers: []inboxtype.Observer{m, logobs.NewObserver(logger, &logobs.Opts{SampleFirst: -1}), &outcomes{ch: b.outcomes}},
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
func linesWith(parsed []map[string]any, status inboxtype.Status) []map[string]any {
	var out []map[string]any
	for _, m := range parsed {
		if m["status"] == string(status) {
			out = append(out, m)
		}
	}
	return out
}

func waitAction(t *testing.T, ch <-chan inboxtype.Outcome, want inboxtype.Action) inboxtype.Outcome {
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
// trace.
func TestLogObserver_HugeDecodeErrorIsBoundedWithoutStack(t *testing.T) {
	t.Parallel()
	b := setupConsumerLog(t, inboxtype.HandlerFunc[loggedPayment](func(context.Context, *inboxtype.Message[loggedPayment]) error {
		return nil
	}), nil)
	body := []byte(`{"order_id":"huge","amount_cents":` + strings.Repeat("9", 10<<20) + `}`)
	b.pub.Publish(b.queue, body, amqp.Publishing{MessageId: "huge-1"})
	waitAction(t, b.outcomes, inboxtype.ActionDeadLettered)

	raw, parsed := b.logs.lines(t)
	for i, line := range raw {
		require.Less(t, len(line), 4<<10, "log line %d is bounded: %.300s", i, line)
		require.NotContains(t, parsed[i], "stacktrace", "no stack on %.300s", line)
		require.NotContains(t, parsed[i], "stack", "no stack on %.300s", line)
		require.NotContains(t, line, "goroutine ", "no stack on %.300s", line)
	}
	dead := linesWith(parsed, inboxtype.StatusDeadLettered)
	require.Len(t, dead, 1)
	require.Equal(t, retry.ReasonDecode, dead[0]["reason"])
	text, _ := dead[0]["error"].(string)
	require.Len(t, text, clip.Limit)
	require.Contains(t, text, "… [truncated from ")
}

// A route whose retries exhaust is dead-lettered with reason exhausted:
// its dead_lettered line says so, as x-error and the metric do. The
// in-process retries and the broker retry have statuses of their own.
func TestLogObserver_ExhaustedDeadLetterLogsTheSettledReason(t *testing.T) {
	t.Parallel()
	b := setupConsumerLog(t, inboxtype.HandlerFunc[loggedPayment](func(context.Context, *inboxtype.Message[loggedPayment]) error {
		return errors.New("gateway down")
	}), &consumer.HandlerOpts{
		Policy:    retry.Exponential{InitialInterval: 10 * time.Millisecond, MaxAttempts: 2},
		InProcess: retry.InProcess{Tries: 1, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
		Queue:     consumer.QueueOpts{Concurrency: 1, RetryTiers: []time.Duration{20 * time.Millisecond}},
	})
	b.pub.Publish(b.queue, []byte(`{"order_id":"ex","amount_cents":1}`), amqp.Publishing{MessageId: "ex-1"})
	o := waitAction(t, b.outcomes, inboxtype.ActionDeadLettered)
	require.Equal(t, retry.ReasonExhausted, o.Decision.Reason)

	dead := amqptest.Drain(t, b.conn, b.queue+".dlq")
	require.Len(t, dead, 1)
	xerr, _ := dead[0].Headers[inboxtype.HeaderError].(string)
	require.True(t, strings.HasPrefix(xerr, retry.ReasonExhausted+": "), "x-error %q", xerr)
	require.InDelta(t, 1, b.counter(t, "dead_lettered_total", "reason", retry.ReasonExhausted), 0)

	_, parsed := b.logs.lines(t)
	lines := linesWith(parsed, inboxtype.StatusDeadLettered)
	require.Len(t, lines, 1)
	require.Equal(t, retry.ReasonExhausted, lines[0]["reason"], "the log says what x-error and the metric say")
	require.Equal(t, "payment:ex", lines[0]["idempotency_key"])

	broker := linesWith(parsed, inboxtype.StatusRetry)
	require.Len(t, broker, 1, "one broker retry (attempt 1 to 2)")
	require.Equal(t, "error", broker[0]["reason"])
	require.InDelta(t, 0.02, broker[0]["delay"], 1e-9, "the broker retry names its delay tier (seconds)")
	require.Len(t, linesWith(parsed, inboxtype.StatusRetryInProcess), 2, "one in-process retry per attempt")
}

var errDeclined = errors.New("card declined")

// A route's own rule decides, not the default classification: a plain
// error that a rule makes permanent is logged with the rule's reason.
func TestLogObserver_CustomRuleIsLoggedAsSettled(t *testing.T) {
	t.Parallel()
	declined := func(err error) (retry.Decision, bool) {
		if errors.Is(err, errDeclined) {
			return retry.Decision{Kind: retry.KindPermanent, Reason: "card_declined"}, true
		}
		return retry.Decision{}, false
	}
	b := setupConsumerLog(t, inboxtype.HandlerFunc[loggedPayment](func(context.Context, *inboxtype.Message[loggedPayment]) error {
		return errDeclined
	}), &consumer.HandlerOpts{Rules: []retry.Rule{declined}})
	b.pub.Publish(b.queue, []byte(`{"order_id":"rule","amount_cents":1}`), amqp.Publishing{MessageId: "rule-1"})
	waitAction(t, b.outcomes, inboxtype.ActionDeadLettered)

	_, parsed := b.logs.lines(t)
	lines := linesWith(parsed, inboxtype.StatusDeadLettered)
	require.Len(t, lines, 1)
	require.Equal(t, "card_declined", lines[0]["reason"])
	require.Equal(t, "card declined", lines[0]["error"])
	require.InDelta(t, 1, b.counter(t, "dead_lettered_total", "reason", "card_declined"), 0)
}

// The received line carries the idempotency key once the payload is
// decoded; an undecodable delivery still gets a received line (without a
// key) and a dead_lettered line. Each delivery is received once.
func TestLogObserver_ReceivedCarriesTheKey(t *testing.T) {
	t.Parallel()
	b := setupConsumerLog(t, inboxtype.HandlerFunc[loggedPayment](func(context.Context, *inboxtype.Message[loggedPayment]) error {
		return nil
	}), &consumer.HandlerOpts{Queue: consumer.QueueOpts{Concurrency: 1}})
	b.pub.Publish(b.queue, []byte(`{"order_id":"r1","amount_cents":1}`), amqp.Publishing{MessageId: "good"})
	b.pub.Publish(b.queue, []byte(`{not json`), amqp.Publishing{MessageId: "bad"})
	waitAction(t, b.outcomes, inboxtype.ActionAcked)
	waitAction(t, b.outcomes, inboxtype.ActionDeadLettered)

	_, parsed := b.logs.lines(t)
	byID := map[string][]inboxtype.Status{}
	keys := map[string]any{}
	for _, m := range parsed {
		id, _ := m["message_id"].(string)
		status, _ := m["status"].(string)
		if id == "" || status == "" {
			continue
		}
		byID[id] = append(byID[id], inboxtype.Status(status))
		if inboxtype.Status(status) == inboxtype.StatusReceived {
			keys[id] = m["idempotency_key"]
		}
	}
	require.Equal(t, []inboxtype.Status{inboxtype.StatusReceived, inboxtype.StatusCompleted}, byID["good"])
	require.Equal(t, "payment:r1", keys["good"])
	require.Equal(t, []inboxtype.Status{inboxtype.StatusReceived, inboxtype.StatusDeadLettered}, byID["bad"])
	require.Empty(t, keys["bad"])
	require.InDelta(t, 2, b.counter(t, "deliveries_received_total", "queue", b.queue), 0)
	require.InDelta(t, 0, b.counter(t, "in_flight", "queue", b.queue), 0)
}
