package inboxmq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/middleware"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/outbox"
	"github.com/inboxmq/inboxmq/retry"
)

// tracedPool opens a pool on schema whose queries are traced with tp
// (otelpgx), as a user wires it: a query inside a span is its child.
func tracedPool(t *testing.T, schema string, tp trace.TracerProvider) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(schema))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(tp), otelpgx.WithDisableAcquireTracer())
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// One order through a worker with tracing: the producer's span, a first
// attempt that fails (its database work rolled back), the retry copy, a
// second attempt linked to the first that commits and enqueues an event,
// and the relay's publish of that event, whose context the event carries.
// The test logs the tree; docs/observability.md shows it.
func TestWorker_TraceOfARetriedDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var schema string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT current_schema()`).Scan(&schema))
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	pool := tracedPool(t, schema, tp)

	routes := inboxmq.NewRoutes()
	inboxmq.HandleTx(routes, b.queue, func(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[order]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, msg.Body.ID); err != nil {
			return err
		}
		if msg.Attempt == 1 {
			return errors.New("gateway timeout")
		}
		return outbox.Enqueue(ctx, tx, outbox.Message{Exchange: b.events, RoutingKey: "order.done", IdempotencyKey: msg.Key, Body: []byte(msg.Body.ID)})
	}, &inboxmq.RouteOpts{
		Retry:       retry.Exponential{InitialInterval: 10 * time.Millisecond, MaxAttempts: 3},
		InProcess:   retry.InProcess{Tries: -1},
		Concurrency: 1,
		Queue:       &inboxmq.QueueOpts{RetryTiers: []time.Duration{50 * time.Millisecond}},
	})
	reg := prometheus.NewRegistry()
	w, err := inboxmq.NewWorker(&inboxmq.Config{
		URL:            testenv.AMQPURL(),
		DB:             pool,
		Routes:         routes,
		Registerer:     reg,
		Exchanges:      []string{b.events},
		TracerProvider: tp,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	require.NoError(t, w.Start(t.Context()))
	ch, err := b.conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(b.sink, false, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(b.sink, "#", b.events, false, nil))
	require.NoError(t, ch.Close())

	ctx, producer := tp.Tracer("producer").Start(t.Context(), "send orders", trace.WithSpanKind(trace.SpanKindProducer))
	b.pub.Publish(b.queue, []byte(`{"id":"o1"}`), amqp.Publishing{MessageId: "m1", Headers: middleware.InjectHeaders(ctx, nil)})
	producer.End()

	testenv.WaitFor(t, "the event is published", func() bool { return amqptest.Depth(t, b.conn, b.sink) == 1 })
	event, ok := amqptest.Get(t, b.conn, b.sink)
	require.True(t, ok)
	require.NoError(t, w.Stop(t.Context()))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`), "the first attempt's write rolled back")

	spans := exp.GetSpans().Snapshots()
	t.Logf("exported span tree:\n%s", renderTree(spans))
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	named := func(name string) []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for _, s := range spans {
			if s.Name() == name {
				out = append(out, s)
			}
		}
		return out
	}
	// under reports whether s descends from ancestor.
	under := func(s, ancestor sdktrace.ReadOnlySpan) bool {
		for p := s.Parent(); p.IsValid(); {
			if p.SpanID() == ancestor.SpanContext().SpanID() {
				return true
			}
			next, ok := byID[p.SpanID()]
			if !ok {
				return false
			}
			p = next.Parent()
		}
		return false
	}
	attr := func(s sdktrace.ReadOnlySpan, k string) attribute.Value {
		for _, kv := range s.Attributes() {
			if string(kv.Key) == k {
				return kv.Value
			}
		}
		return attribute.Value{}
	}

	consumes := named("process " + b.queue)
	require.Len(t, consumes, 2, "one consumer span per attempt")
	slices.SortFunc(consumes, func(x, y sdktrace.ReadOnlySpan) int {
		return int(attr(x, "inboxmq.attempt").AsInt64() - attr(y, "inboxmq.attempt").AsInt64())
	})
	first, second := consumes[0], consumes[1]
	for _, s := range consumes {
		require.Equal(t, producer.SpanContext().SpanID(), s.Parent().SpanID(), "every attempt is the producer's child")
		require.Equal(t, "order:o1", attr(s, "inboxmq.idempotency_key").AsString())
	}
	require.Equal(t, int64(1), attr(first, "inboxmq.attempt").AsInt64())
	require.Equal(t, "retry", attr(first, "inboxmq.outcome").AsString())
	require.Equal(t, "retried", attr(first, "inboxmq.action").AsString())
	require.Empty(t, first.Links())
	require.Equal(t, int64(2), attr(second, "inboxmq.attempt").AsInt64())
	require.Equal(t, "acked", attr(second, "inboxmq.action").AsString())
	require.Len(t, second.Links(), 1, "the retry links to the attempt that failed")
	require.Equal(t, first.SpanContext().SpanID(), second.Links()[0].SpanContext.SpanID())

	// The handler's database work nests under each attempt.
	for _, s := range consumes {
		handlers := 0
		inserts := 0
		for _, h := range named("inbox.handler") {
			if under(h, s) {
				handlers++
				for _, q := range spans {
					if under(q, h) && strings.Contains(attr(q, "db.query.text").AsString()+attr(q, "db.statement").AsString(), "INSERT INTO effects") {
						inserts++
					}
				}
			}
		}
		require.Equal(t, 1, handlers, "attempt %d has its handler span", attr(s, "inboxmq.attempt").AsInt64())
		require.Positive(t, inserts, "attempt %d has its INSERT as a database span", attr(s, "inboxmq.attempt").AsInt64())
	}

	// The relay's publish: a producer span below the second attempt,
	// whose context the event carries.
	publishes := named("publish " + b.events)
	require.Len(t, publishes, 1)
	pub := publishes[0]
	require.Equal(t, trace.SpanKindProducer, pub.SpanKind())
	require.True(t, under(pub, second), "the event is published in the second attempt's trace")
	sent := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), middleware.HeaderCarrier(event.Headers)))
	require.Equal(t, pub.SpanContext().SpanID(), sent.SpanID(), "the event's traceparent is the publish span")

	// The latency histograms' exemplars name the trace.
	traceID := second.SpanContext().TraceID().String()
	require.Contains(t, exemplarTraceIDs(t, reg, "inboxmq_handler_duration_seconds"), traceID)
	require.Contains(t, exemplarTraceIDs(t, reg, "inboxmq_job_processing_duration_seconds"), traceID)
}

// exemplarTraceIDs returns the trace_id of every exemplar of the
// histogram family name.
func exemplarTraceIDs(t *testing.T, g prometheus.Gatherer, name string) []string {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	var ids []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, bk := range m.GetHistogram().GetBucket() {
				for _, lp := range bk.GetExemplar().GetLabel() {
					if lp.GetName() == "trace_id" {
						ids = append(ids, lp.GetValue())
					}
				}
			}
		}
	}
	return ids
}

// renderTree draws spans as an indented tree, children in start order,
// with each span's kind, its inboxmq.* and messaging.destination
// attributes, the database statement, and its links.
func renderTree(spans []sdktrace.ReadOnlySpan) string {
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	ids := map[trace.SpanID]bool{}
	for _, s := range spans {
		ids[s.SpanContext().SpanID()] = true
	}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if p := s.Parent(); p.IsValid() && ids[p.SpanID()] {
			children[p.SpanID()] = append(children[p.SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(x, y sdktrace.ReadOnlySpan) int { return x.StartTime().Compare(y.StartTime()) }
	names := map[trace.SpanID]string{}
	for _, s := range spans {
		names[s.SpanContext().SpanID()] = s.Name()
	}
	var sb strings.Builder
	var draw func(s sdktrace.ReadOnlySpan, depth int)
	draw = func(s sdktrace.ReadOnlySpan, depth int) {
		fmt.Fprintf(&sb, "%s%s [%s]", strings.Repeat("  ", depth), s.Name(), s.SpanKind())
		for _, kv := range s.Attributes() {
			k := string(kv.Key)
			switch {
			case strings.HasPrefix(k, "inboxmq.") && k != "inboxmq.in_process_retries":
				fmt.Fprintf(&sb, " %s=%s", k, kv.Value.String())
			case k == "db.query.text" || k == "db.statement":
				fmt.Fprintf(&sb, " %q", strings.Join(strings.Fields(kv.Value.AsString()), " "))
			}
		}
		if s.Status().Code.String() == "Error" {
			fmt.Fprintf(&sb, " status=Error(%s)", s.Status().Description)
		}
		for _, l := range s.Links() {
			fmt.Fprintf(&sb, " link→%q", names[l.SpanContext.SpanID()])
		}
		sb.WriteString("\n")
		kids := children[s.SpanContext().SpanID()]
		slices.SortFunc(kids, byStart)
		for _, c := range kids {
			draw(c, depth+1)
		}
	}
	slices.SortFunc(roots, byStart)
	for _, r := range roots {
		draw(r, 0)
	}
	return sb.String()
}
