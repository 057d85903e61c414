package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/outbox"
)

// The full payment chain, cases (p), (pt), (pg), (pts) and (pc): what
// examples/payment-worker does per delivery, through the façade
// (inboxmq.NewWorker) and by hand.

// eventsExchange receives the chain's payment.completed events; nothing
// is bound to it (the example's relay allows unroutable events).
var eventsExchange = benchName + ".events"

const eventRoutingKey = "payment.completed"

// chainEvent is the body of a payment.completed event.
type chainEvent struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Status      string `json:"status"`
}

// chainResult is the result the example stores with each payment.
type chainResult struct {
	OrderID string `json:"order_id"`
	Status  string `json:"status"`
}

// recordPayment is examples/payment-worker's transactional handler
// (worker.go), on the benchmark's tables: a batch handler queueing the
// payment, its ledger entry and its event, which the inbox sends with the
// claim and the result in one round trip.
func recordPayment(ctx context.Context, b *pgx.Batch, msg *inboxtype.Message[payment]) error {
	p := msg.Body
	body, err := json.Marshal(chainEvent{OrderID: p.OrderID, AmountCents: p.AmountCents, Currency: p.Currency, Status: "completed"})
	if err != nil {
		return err
	}
	b.Queue(sqlPayment, p.OrderID, p.AmountCents, p.Currency)
	b.Queue(sqlLedger, p.OrderID, p.AmountCents)
	if err := outbox.AddToBatch(ctx, b, outbox.Message{
		Exchange: eventsExchange, RoutingKey: eventRoutingKey, IdempotencyKey: p.IdempotencyKey(),
		ContentType: "application/json", Body: body,
	}); err != nil {
		return err
	}
	return msg.SetResult(chainResult{OrderID: p.OrderID, Status: "completed"})
}

// recordPaymentTx is recordPayment as a transactional handler: the same
// writes, result and event through the handler's pgx.Tx (cases (pt),
// (pts)), to weigh inbox.HandleTx against inbox.BatchHandler.
func recordPaymentTx(ctx context.Context, tx pgx.Tx, msg *inboxtype.Message[payment]) error {
	p := msg.Body
	body, err := json.Marshal(chainEvent{OrderID: p.OrderID, AmountCents: p.AmountCents, Currency: p.Currency, Status: "completed"})
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sqlPayment, p.OrderID, p.AmountCents, p.Currency); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sqlLedger, p.OrderID, p.AmountCents); err != nil {
		return err
	}
	if err := outbox.Enqueue(ctx, tx, outbox.Message{
		Exchange: eventsExchange, RoutingKey: eventRoutingKey, IdempotencyKey: p.IdempotencyKey(),
		ContentType: "application/json", Body: body,
	}); err != nil {
		return err
	}
	return msg.SetResult(chainResult{OrderID: p.OrderID, Status: "completed"})
}

// chainCase is (p) (gc nil) or (pg): the example's worker, wired as its
// run() wires it — controls (the block check), the completed-cache and the
// lock on Redis, replies, the outbox relay with confirms to an events
// exchange, metrics, reconciler and retention — on a queue of type typ
// with concurrency handlers (0: the façade's default). Not wired: the
// HTTP listener (/metrics is not scraped during the drain) and tracing
// (no exporter configured: spans do not record). Its logger is the
// example's (exampleLogger).
// With tx, the handler is recordPaymentTx through inboxmq.HandleTx:
// (pt) and (pts).
func chainCase(e *env, typ consumer.QueueType, gc *inbox.GroupCommit, concurrency int, tx bool) runner {
	return func(ctx context.Context, queue string, done func(time.Time)) (func() error, error) {
		routes := inboxmq.NewRoutes()
		opts := &inboxmq.RouteOpts{
			Concurrency: concurrency,
			Queue:       &inboxmq.QueueOpts{Type: inboxmq.QueueType(typ), DeliveryLimit: benchDeliveryLimit},
			Reply:       true,
			GroupCommit: gc,
			Middleware:  []inboxtype.Middleware{committed(done)},
		}
		if tx {
			inboxmq.HandleTx(routes, queue, recordPaymentTx, opts)
		} else {
			inboxmq.HandleBatch(routes, queue, recordPayment, opts)
		}
		reg := prometheus.NewRegistry()
		e.registry.Store(reg)
		w, err := inboxmq.NewWorker(&inboxmq.Config{
			URL: e.amqpURL, DB: e.pool, Redis: e.redis, Routes: routes, Name: benchName,
			Logger: exampleLogger(), Registerer: reg,
			Exchanges: []string{eventsExchange}, DropUnroutable: true,
		})
		if err != nil {
			return nil, err
		}
		if err := w.Start(ctx); err != nil {
			return nil, err
		}
		acked := func() float64 { return ackedTotal(reg) }
		e.acked.Store(&acked)
		return func() error {
			e.acked.Store(nil)
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return w.Stop(sctx)
		}, nil
	}
}

// exampleLogger stands in for the example's logger (zap JSON at info
// through zapslog, which this command may not import): a JSON slog
// logger at info writing to nowhere, so every line is encoded and none is
// written (slog.DiscardHandler would skip the encoding).
func exampleLogger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(nowhere{}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// nowhere drops what is written to it.
type nowhere struct{}

func (nowhere) Write(p []byte) (int, error) { return len(p), nil }

// committed reports every delivery whose handler returned nil to done: as
// the route's innermost middleware it returns after the inbox's commit
// (and, in group commit, after the batch's). The drain then waits for the
// acks themselves (chainSettled).
func committed(done func(time.Time)) inboxtype.Middleware {
	return func(next inboxtype.DeliveryHandler) inboxtype.DeliveryHandler {
		return func(ctx context.Context, d *inboxtype.Delivery) error {
			err := next(ctx, d)
			if err == nil {
				done(publishedAt(d.Headers))
			}
			return err
		}
	}
}

// ackedTotal reads deliveries_settled_total{action="acked"} from reg.
func ackedTotal(reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "inboxmq_deliveries_settled_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "action" && l.GetValue() == "acked" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// chainSettled waits until every delivery is acked (the worker's own
// count, when the case runs the worker) and every outbox row is sent: the
// chain cases' drain ends then.
func (e *env) chainSettled(ctx context.Context, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	if acked := e.acked.Load(); acked != nil {
		for (*acked)() < float64(n) {
			if time.Now().After(deadline) {
				return fmt.Errorf("%w: %.0f of %d deliveries acked", errTimeout, (*acked)(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for {
		var pending bool
		if err := e.admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM inboxmq_outbox WHERE sent_at IS NULL)").Scan(&pending); err != nil {
			return err
		}
		if !pending {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: outbox rows still pending", errTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// chainBatchField is the GroupCommit field that (pg) and (pts) set, for
// their descriptions: none at the default.
func (e *env) chainBatchField() string {
	if e.chainBatch <= 0 {
		return ""
	}
	return "MaxBatch: " + strconv.Itoa(e.chainBatch)
}

// chainCases returns (p), (pt), (pg), (pts), (pgx), (pc) and (pgc) on a
// queue of type typ (ids suffixed "q" on a quorum queue).
func chainCases(e *env, typ consumer.QueueType) []benchCase {
	suffix, on := "", ""
	if typ == consumer.Quorum {
		suffix, on = "q", ", quorum queue"
	}
	return []benchCase{
		{"p" + suffix, fmt.Sprintf("inboxmq full payment chain (payment-worker defaults), %d handlers%s", e.workers, on), typ,
			chainCase(e, typ, nil, e.workers, false), e.chainSettled},
		{"pt" + suffix, fmt.Sprintf("(p) with a transactional handler (HandleTx), %d handlers%s", e.workers, on), typ,
			chainCase(e, typ, nil, e.workers, true), e.chainSettled},
		{"pg" + suffix, fmt.Sprintf("inboxmq full payment chain, GROUP_COMMIT=on (GroupCommit{%s}, the route's default concurrency)%s", e.chainBatchField(), on), typ,
			chainCase(e, typ, &inbox.GroupCommit{MaxBatch: e.chainBatch}, 0, false), e.chainSettled},
		{"pts" + suffix, fmt.Sprintf("(pg) with a transactional handler (HandleTx, GroupCommit{%s}: a savepoint per delivery)%s", e.chainBatchField(), on), typ,
			chainCase(e, typ, &inbox.GroupCommit{MaxBatch: e.chainBatch}, 0, true), e.chainSettled},
		{"pgx" + suffix, fmt.Sprintf("(pg) while another session holds a transaction open: the xmin horizon pinned%s", on), typ,
			e.pinned(chainCase(e, typ, &inbox.GroupCommit{MaxBatch: e.chainBatch}, 0, false)), e.chainSettled},
		{"pc" + suffix, fmt.Sprintf("hand-written full payment chain, %d handlers, events pipelined%s", e.workers, on), typ,
			chainLoop(e, e.workers), e.chainSettled},
		{"pgc" + suffix, fmt.Sprintf("hand-written full payment chain, %d per tx, %d batches in flight, events pipelined%s", e.batch, e.inflight, on), typ,
			chainBatchedLoop(e, e.batch, e.inflight, 2*time.Millisecond), e.chainSettled},
	}
}

// The hand-written chain, case (pc).
const (
	sqlChainInbox = `INSERT INTO inboxmq_inbox (consumer, key, status, fingerprint, attempts, message_id, completed_at, result)
VALUES ($1, $2, 'completed', $3, 1, $4, now(), $5) ON CONFLICT (consumer, key) DO NOTHING`
	sqlChainOutbox = `INSERT INTO inboxmq_outbox (message_id, exchange, routing_key, headers, content_type, body, idempotency_key)
VALUES ($1, $2, $3, $4, 'application/json', $5, $6) RETURNING id`
	sqlChainMark = `UPDATE inboxmq_outbox SET sent_at = clock_timestamp() WHERE id = ANY($1)`
	// chainCacheTTL bounds the benchmark's completed-cache keys in Redis.
	chainCacheTTL = 10 * time.Minute
)

var errChainDuplicate = errors.New("inboxbench: duplicate")

// markSent marks the published rows sent, every id waiting in one UPDATE.
func (e *env) markSent(marks <-chan int64) {
	ids := make([]int64, 0, 256)
	for id := range marks {
		ids = append(ids[:0], id)
	more:
		for len(ids) < cap(ids) {
			select {
			case id, ok := <-marks:
				if !ok {
					break more
				}
				ids = append(ids, id)
			default:
				break more
			}
		}
		if _, err := e.pool.Exec(context.Background(), sqlChainMark, ids); err != nil {
			log.Printf("(pc) mark sent: %v", err)
		}
	}
}
