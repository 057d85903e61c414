package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/confirm"
	"github.com/inboxmq/inboxmq/internal/envelope"
	"github.com/inboxmq/inboxmq/internal/outboxwire"
	"github.com/inboxmq/inboxmq/outbox"
)

// pendingRow is one claimed outbox row.
type pendingRow struct {
	id          int64
	messageID   string
	exchange    string
	routingKey  string
	headers     []byte
	contentType string
	body        []byte
	attempts    int
	// props are the AMQP properties of a row that carries a whole message
	// (a scheduled retry, schedule.go); nil for an enqueued row.
	props []byte
}

// claimSQL takes up to $1 pending rows in id order, and of each ordering
// key only its head: a row whose key has an earlier unsent row (claimed
// by another lane or relay, backing off, or not yet published) waits, so
// a key's rows go out one at a time, in enqueue order. The NOT EXISTS runs
// only for a row that has a key (docs/internals.md has the plan).
const claimSQL = `SELECT o.id, o.message_id, o.exchange, o.routing_key, o.headers, o.content_type, o.body, o.attempts, o.properties
FROM inboxmq_outbox o
WHERE o.sent_at IS NULL AND o.available_at <= clock_timestamp()
  AND (o.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM inboxmq_outbox p
        WHERE p.ordering_key = o.ordering_key AND p.sent_at IS NULL AND p.id < o.id))
ORDER BY o.id
LIMIT $1
FOR UPDATE OF o SKIP LOCKED`

// claimSQLWithoutProperties is claimSQL on an outbox table without the
// properties column (before migration 00008).
var claimSQLWithoutProperties = strings.Replace(claimSQL, "o.properties", "NULL::jsonb", 1)

const markSentSQL = `UPDATE inboxmq_outbox SET sent_at = clock_timestamp(), last_error = NULL
WHERE id = ANY($1)
RETURNING extract(epoch FROM sent_at - created_at)::float8`

const markFailedSQL = `UPDATE inboxmq_outbox
SET attempts = attempts + 1, last_error = $2, available_at = clock_timestamp() + make_interval(secs => $3)
WHERE id = $1`

// relayBatch claims up to BatchSize rows, publishes them, waits for the
// confirms and marks the confirmed rows sent, in one transaction that holds
// the rows' locks throughout. It returns the number of rows of the last
// batch it claimed.
//
// A batch costs two PostgreSQL round trips: BEGIN with the claim, then the
// marks with COMMIT. While rows keep coming (the batch was full, or a
// wake-up arrived while it was in flight) the lane goes on with the next
// batch at once, and the next BEGIN and claim travel in the COMMIT's round
// trip: a busy lane pays one round trip per batch. It runs on a connection
// the relay acquires itself and releases idle, so the pool spends no round
// trip ending it.
//
// Each batch runs on a context detached from ctx's cancellation, so a
// stopping relay finishes it (bounded by publishTimeout) instead of leaving
// confirmed rows unmarked; it claims no further batch once ctx is done.
func (r *Relay) relayBatch(ctx context.Context, l *lane) (int, error) {
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	base := context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(base, publishTimeout)
	defer cancel()

	c, err := r.pool.Acquire(cctx)
	if err != nil {
		return 0, fmt.Errorf("relay: acquire connection: %w", err)
	}
	// Release destroys a connection left in a transaction; rollback ends it
	// first on every path where COMMIT was not reached.
	defer c.Release()
	conn := c.Conn()
	defer rollback(base, conn)

	batch, err := r.claim(cctx, conn)
	for err == nil {
		var more bool
		var n int
		n, batch, more, err = r.relayOne(ctx, l, conn, batch)
		if !more || err != nil {
			return n, err
		}
	}
	return 0, err
}

// relayOne publishes batch, claimed in conn's open transaction, and ends
// that transaction, within publishTimeout. more reports whether the lane goes on at once: next
// is then the next batch, claimed in the COMMIT's round trip, in a
// transaction of its own.
func (r *Relay) relayOne(ctx context.Context, l *lane, conn *pgx.Conn, batch []pendingRow) (n int, next []pendingRow, more bool, err error) {
	start := time.Now()
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishTimeout)
	defer cancel()
	if r.hooks.claimed != nil {
		r.hooks.claimed(len(batch))
	}
	if len(batch) == 0 {
		_, _, _, err := finish(bctx, conn, nil, &publishResult{}, nil, "", 0)
		return 0, nil, false, err
	}
	if r.killed.Load() { // a test hook "killed" the relay: publish nothing more
		return 0, nil, false, nil
	}

	res := r.publish(bctx, l, batch)
	defer res.endSpans()

	if r.hooks.afterConfirm != nil && len(res.sent) > 0 {
		ids := make([]string, 0, len(res.sent))
		for _, i := range res.sent {
			ids = append(ids, batch[i].messageID)
		}
		if err := r.hooks.afterConfirm(ids); err != nil {
			r.killed.Store(true) // before the rollback frees the rows
			return len(batch), nil, false, &killedError{err: err}
		}
	}

	if r.hooks.published != nil {
		r.hooks.published(l.wake)
	}
	// Rows keep coming: a full batch, or a wake-up that came while this
	// one was in flight. Gathering them a moment longer (holding this
	// batch's rows, already published) makes the next batch bigger, and
	// the next claim rides with this COMMIT.
	full := len(batch) == r.cfg.BatchSize
	more = res.err == nil && ctx.Err() == nil && (full || len(l.wake) > 0)
	claimNext := ""
	if more {
		claimNext = r.claimSQL()
		if !full {
			select {
			case <-l.wake: // this lane answers it
			default:
			}
			if r.cfg.GatherDelay > 0 {
				if r.hooks.gather != nil {
					r.hooks.gather()
				}
				sleep(ctx, r.cfg.GatherDelay)
			}
		}
	}

	lags, next, claimErr, err := finish(bctx, conn, batch, &res, r.retryDelay, claimNext, r.cfg.BatchSize)
	if err != nil {
		return len(batch), nil, false, err
	}

	r.metrics.published.Add(float64(len(res.sent)))
	for _, l := range lags {
		r.metrics.lag.Observe(l)
	}
	for _, f := range res.failed {
		r.metrics.failed.WithLabelValues(f.reason).Inc()
	}
	if res.unconfirmed > 0 {
		r.metrics.failed.WithLabelValues(reasonUnconfirmed).Add(float64(res.unconfirmed))
	}
	lvl, msg := slog.LevelDebug, "outbox relay: batch published"
	if len(res.failed) > 0 || res.err != nil {
		lvl, msg = slog.LevelWarn, "outbox relay: batch partly failed"
	}
	if r.log.Enabled(ctx, lvl) {
		attrs := make([]slog.Attr, 0, 6)
		attrs = append(attrs,
			slog.Int("claimed", len(batch)), slog.Int("published", len(res.sent)),
			slog.Int("failed", len(res.failed)), slog.Int("unconfirmed", res.unconfirmed),
			slog.Duration("duration", time.Since(start)))
		if res.err != nil {
			attrs = append(attrs, slog.Any("error", res.err))
		}
		r.log.LogAttrs(ctx, lvl, msg, attrs...)
	}
	if res.err != nil {
		return len(batch), nil, false, &brokerError{err: res.err}
	}
	if res.retryNacked {
		// A channel may keep refusing a quorum queue whose leader it lost
		// track of: the next batch goes out on a new connection.
		l.closeBroker()
	}
	if claimErr != nil {
		return len(batch), nil, false, claimErr
	}
	if more && full {
		notify(l.wake) // more may be waiting: another idle lane helps
	}
	return len(batch), next, more, nil
}

// claim begins the batch's transaction on conn and claims up to BatchSize
// rows in it, in one round trip.
func (r *Relay) claim(ctx context.Context, conn *pgx.Conn) (batch []pendingRow, err error) {
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue(r.claimSQL(), r.cfg.BatchSize)
	br := conn.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("relay: claim: %w", cerr)
		}
		r.checkProperties(ctx, err)
	}()
	return readClaim(br)
}

// finish marks the rows of res (the confirmed ones sent, the failed ones
// for a retry after retryDelay) and commits, in one round trip: the
// statements and COMMIT travel as one batch. On a failed mark PostgreSQL
// skips the COMMIT and the transaction stays open (aborted) for rollback.
// It returns the confirmed rows' enqueue-to-sent lags in seconds.
//
// With claimNext set, BEGIN and that claim of up to size rows follow the
// COMMIT in the same round trip: next is the next batch, in its own open
// transaction, and claimErr its failure (the COMMIT before it stands).
func finish(ctx context.Context, conn *pgx.Conn, batch []pendingRow, res *publishResult, retryDelay func(int) time.Duration,
	claimNext string, size int,
) (lags []float64, next []pendingRow, claimErr, err error) {
	b := &pgx.Batch{}
	if len(res.sent) > 0 {
		ids := make([]int64, len(res.sent))
		for k, i := range res.sent {
			ids[k] = batch[i].id
		}
		b.Queue(markSentSQL, ids)
	}
	for _, f := range res.failed {
		p := batch[f.index]
		delay := retryDelay(p.attempts + 1)
		if p.props != nil && f.reason == reasonNack {
			// A scheduled retry has a due time: a queue that refused it
			// (its leader moving) is tried again soon, not minutes later.
			delay = min(delay, scheduledNackMaxDelay)
		}
		b.Queue(markFailedSQL, p.id, f.reason+": "+f.detail, delay.Seconds())
	}
	b.Queue("commit")
	if claimNext != "" {
		b.Queue("begin")
		b.Queue(claimNext, size)
	}
	br := conn.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil && claimErr == nil && cerr != nil {
			claimErr = fmt.Errorf("relay: claim: %w", cerr)
		}
	}()
	if len(res.sent) > 0 {
		rows, err := br.Query()
		if err == nil {
			lags, err = pgx.CollectRows(rows, pgx.RowTo[float64])
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("relay: mark sent: %w", err)
		}
	}
	for range res.failed {
		if _, err := br.Exec(); err != nil {
			return nil, nil, nil, fmt.Errorf("relay: mark failed: %w", err)
		}
	}
	tag, err := br.Exec()
	if err != nil {
		// As pgx's Tx.Commit: a COMMIT that failed with the transaction
		// still open leaves the connection's state unknown.
		if conn.PgConn().TxStatus() != 'I' {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
		return nil, nil, nil, fmt.Errorf("relay: commit: %w", err)
	}
	if tag.String() == "ROLLBACK" {
		return nil, nil, nil, fmt.Errorf("relay: commit: %w", pgx.ErrTxCommitRollback)
	}
	if claimNext != "" {
		next, claimErr = readClaim(br)
	}
	return lags, next, claimErr, nil
}

// rollback ends conn's transaction, if one is still open, so that the pool
// gets the connection back idle. If the ROLLBACK fails it closes conn (the
// server then rolls back), as pgx's Tx.Rollback does.
func rollback(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, "rollback"); err != nil {
		_ = conn.Close(ctx)
	}
}

// rollbackTimeout bounds the ROLLBACK of a failed batch.
const rollbackTimeout = 5 * time.Second

// readClaim reads BEGIN's and the claim's results from br (the caller
// closes it).
func readClaim(br pgx.BatchResults) ([]pendingRow, error) {
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("relay: begin: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("relay: claim: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (pendingRow, error) {
		var p pendingRow
		err := row.Scan(&p.id, &p.messageID, &p.exchange, &p.routingKey, &p.headers, &p.contentType, &p.body, &p.attempts, &p.props)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("relay: claim: %w", err)
	}
	return batch, nil
}

type failure struct {
	index          int
	reason, detail string
}

type publishResult struct {
	sent        []int        // indexes of confirmed (and routed) rows
	failed      []failure    // nacked or returned rows: back off
	unconfirmed int          // rows with no answer (connection lost): left as they were
	err         error        // the broker failure, if any
	spans       []trace.Span // per row of the batch; nil when not recording
	retryNacked bool         // a scheduled retry was nacked
}

// endSpans ends the rows' publish spans with their result: confirmed,
// failed (nacked, returned or corrupt: the reason), or left without an
// answer (the connection was lost).
func (res *publishResult) endSpans() {
	if res.spans == nil {
		return
	}
	failed := make(map[int]failure, len(res.failed))
	for _, f := range res.failed {
		failed[f.index] = f
	}
	sent := make(map[int]bool, len(res.sent))
	for _, i := range res.sent {
		sent[i] = true
	}
	for i, s := range res.spans {
		if s == nil {
			continue
		}
		if f, ok := failed[i]; ok {
			s.SetStatus(codes.Error, f.reason+": "+f.detail)
		} else if !sent[i] {
			msg := "unconfirmed"
			if res.err != nil {
				msg += ": " + res.err.Error()
			}
			s.SetStatus(codes.Error, msg)
		}
		s.End()
	}
}

// publish sends the rows of batch on the lane's confirm channel, in one
// socket write (the lane's connection holds its writes while amqp091
// frames them), and waits for all the confirms. A corrupt row, or one whose
// headers cannot fit in a frame, is not sent: it fails alone, and backs
// off. When the write or the channel fails, the rows without an answer are
// left unconfirmed, to be published again (a row that did reach the broker
// is then a duplicate, which the receiver's inbox absorbs).
func (r *Relay) publish(ctx context.Context, l *lane, batch []pendingRow) publishResult {
	var res publishResult
	msgs, rows := l.msgs[:0], l.rows[:0]
	mandatory, now := !r.cfg.AllowUnroutable, time.Now()
	for i := range batch {
		p := &batch[i]
		headers, err := outboxwire.DecodeHeaders(p.headers)
		if err != nil { // corrupt row: keep it, back off, tell the operator
			res.failed = append(res.failed, failure{index: i, reason: reasonInvalid, detail: err.Error()})
			continue
		}
		// A scheduled retry keeps the trace context its consumer gave it
		// (the next attempt is the producer's child, linked to the last),
		// as it would through a delay queue: it gets no span of the relay's.
		if p.props == nil {
			if span := r.startPublishSpan(ctx, p, headers); span != nil {
				if res.spans == nil {
					res.spans = make([]trace.Span, len(batch))
				}
				res.spans[i] = span
			}
		}
		pub := amqp.Publishing{
			Headers:      headers,
			ContentType:  p.contentType,
			DeliveryMode: amqp.Persistent,
			MessageId:    p.messageID,
			Timestamp:    now,
			Body:         p.body,
		}
		if p.props != nil {
			if err := outboxwire.DecodeProperties(p.props, &pub); err != nil {
				res.failed = append(res.failed, failure{index: i, reason: reasonInvalid, detail: err.Error()})
				continue
			}
		}
		// A scheduled retry is never dropped as unroutable: it backs off
		// until its queue is back.
		msgs = append(msgs, confirm.Message{Exchange: p.exchange, RoutingKey: p.routingKey, Mandatory: mandatory || p.props != nil, Publishing: pub})
		rows = append(rows, i)
	}
	l.msgs, l.rows = msgs, rows
	defer clear(msgs) // the next batch reuses the slices, not the rows

	errs, err := l.pool.PublishBatch(ctx, msgs, r.hold(l, len(batch)))
	res.err = err
	for k, e := range errs {
		if e == nil {
			res.sent = append(res.sent, rows[k])
			continue
		}
		if f, answered := rowFailure(rows[k], e); answered {
			res.failed = append(res.failed, f)
			res.retryNacked = res.retryNacked || (f.reason == reasonNack && batch[rows[k]].props != nil)
		} else {
			res.unconfirmed++
		}
	}
	return res
}

// rowFailure is the failure of batch row i, whose publish failed with e: a
// nack, a return, or a row too large to send. answered is false when the
// row got no answer. (Its own function: the errors.As targets are then
// allocated only for a failed row.)
func rowFailure(i int, e error) (f failure, answered bool) {
	var (
		ret      *confirm.ReturnedError
		tooLarge *confirm.TooLargeError
	)
	switch {
	case errors.Is(e, confirm.ErrNacked):
		return failure{index: i, reason: reasonNack, detail: e.Error()}, true
	case errors.As(e, &ret):
		return failure{index: i, reason: reasonUnroutable, detail: fmt.Sprintf("%d %s", ret.Return.ReplyCode, ret.Return.ReplyText)}, true
	case errors.As(e, &tooLarge):
		return failure{index: i, reason: reasonInvalid, detail: e.Error()}, true
	default:
		return failure{}, false
	}
}

// hold is the lane's socket as the batch's [confirm.Holder], wrapped in
// the test hooks when they are set.
func (r *Relay) hold(l *lane, rows int) confirm.Holder {
	if r.hooks.held == nil && r.hooks.released == nil {
		return l.sock
	}
	return &hookedHold{hooks: &r.hooks, sock: l.sock, rows: rows}
}

// hookedHold runs the held hook before a batch's held writes go out and
// the released hook after.
type hookedHold struct {
	hooks  *testHooks
	sock   *amqpdial.HoldConn
	rows   int
	writes int64
}

func (h *hookedHold) Hold() {
	h.writes = h.sock.Writes()
	h.sock.Hold()
}

func (h *hookedHold) Release() error {
	if h.hooks.held != nil {
		h.hooks.held(h.sock)
	}
	err := h.sock.Release()
	if h.hooks.released != nil {
		h.hooks.released(h.rows, h.sock.Writes()-h.writes, err)
	}
	return err
}

// startPublishSpan starts the producer span of row p, a child of the trace
// context stored in its headers, and writes the span's context into
// headers in its place. It returns nil, and leaves headers as they are,
// when the span does not record. As the consumer's span (middleware.Tracing),
// it gets its attributes once it is known to record: a span that does not
// (no SDK installed, or not sampled) costs no attribute.
func (r *Relay) startPublishSpan(ctx context.Context, p *pendingRow, headers amqp.Table) trace.Span {
	prop := propagation.TraceContext{}
	dest := p.exchange
	if dest == "" {
		dest = p.routingKey
	}
	ctx = prop.Extract(ctx, envelope.Carrier(headers))
	_, span := r.tracer.Start(ctx, r.spanName.get(dest), publishSpanKind)
	if !span.IsRecording() {
		span.End()
		return nil
	}
	span.SetAttributes(
		attribute.String("messaging.system", "rabbitmq"),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.operation.name", "publish"),
		attribute.String("messaging.destination.name", dest),
		attribute.String("messaging.rabbitmq.destination.routing_key", p.routingKey),
		attribute.String("messaging.message.id", p.messageID),
		attribute.Int("messaging.message.body.size", len(p.body)),
		attribute.Int("inboxmq.outbox.attempts", p.attempts),
	)
	prop.Inject(trace.ContextWithSpan(ctx, span), envelope.Carrier(headers))
	return span
}

var publishSpanKind = trace.WithSpanKind(trace.SpanKindProducer)

// spanName caches "publish <destination>" for the last destination, so
// that a row whose span does not record costs no allocation for its name.
type spanName struct {
	last atomic.Pointer[[2]string] // destination, name
}

func (n *spanName) get(dest string) string {
	if p := n.last.Load(); p != nil && p[0] == dest {
		return p[1]
	}
	name := "publish " + dest
	n.last.Store(&[2]string{dest, name})
	return name
}

// retryDelay is RetryMinDelay·2^(attempt-1), capped at RetryMaxDelay.
func (r *Relay) retryDelay(attempt int) time.Duration {
	d := r.cfg.RetryMinDelay
	for i := 1; i < attempt && d < r.cfg.RetryMaxDelay; i++ {
		d *= 2
	}
	return min(d, r.cfg.RetryMaxDelay)
}

func (r *Relay) refreshStats(ctx context.Context) {
	b, err := outbox.ReadBacklog(ctx, r.pool)
	if err != nil {
		if ctx.Err() == nil {
			r.log.LogAttrs(ctx, slog.LevelWarn, "outbox relay: stats query failed", slog.Any("error", err))
		}
		return
	}
	r.metrics.pending.Set(float64(b.Pending))
	r.metrics.oldestAge.Set(b.OldestAge.Seconds())
}
