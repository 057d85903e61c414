// Package logs is the worker's log observer: one structured line per
// transition of each delivery, through the *slog.Logger it is given.
package logs

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/clip"
	"github.com/inboxmq/inboxmq/retry"
)

// Log field names written by [NewObserver]. They are stable: the runbook's
// jq queries and log-based dashboards select on them. docs/observability.md
// lists them; that list is the contract.
const (
	logFieldStatus         = "status"
	logFieldMessageID      = "message_id"
	logFieldIdempotencyKey = "idempotency_key"
	logFieldNamespace      = "namespace"
	logFieldQueue          = "queue"
	logFieldWorkerID       = "worker_id"
	logFieldAttempt        = "attempt"
	logFieldRedelivered    = "redelivered"
	logFieldDeliveryCount  = "delivery_count"
	logFieldLockKey        = "lock_key"
	logFieldLockResult     = "lock_result"
	logFieldLockFence      = "lock_fence"
	logFieldFence          = "fence"
	logFieldDuration       = "duration"
	logFieldSource         = "duplicate_source"
	logFieldOrigin         = "duplicate_origin"
	logFieldReason         = "reason"
	logFieldAction         = "action"
	logFieldDelay          = "delay"
	logFieldError          = "error"
)

// Opts configures [NewObserver]. A nil *Opts means all defaults.
type Opts struct {
	// SuccessLevel is the level of the per-delivery success lines (received,
	// locked, processing, completed). Defaults to slog.LevelInfo (the zero
	// value).
	SuccessLevel slog.Level
	// SampleInterval is the sampling window for success lines. Defaults to 1s.
	SampleInterval time.Duration
	// SampleFirst is how many success lines of each status are written per
	// SampleInterval before sampling starts. Defaults to 100; -1 disables
	// sampling (every line is written).
	SampleFirst int
	// SampleThereafter: after SampleFirst, one success line in
	// SampleThereafter is written per interval. Defaults to 100.
	SampleThereafter int
}

func (o *Opts) withDefaults() Opts {
	var out Opts
	if o != nil {
		out = *o
	}
	if out.SampleInterval <= 0 {
		out.SampleInterval = time.Second
	}
	if out.SampleFirst == 0 {
		out.SampleFirst = 100
	}
	if out.SampleThereafter <= 0 {
		out.SampleThereafter = 100
	}
	return out
}

// logObserver writes one structured line per status transition.
type logObserver struct {
	logger *slog.Logger
	level  slog.Level // of the success lines
	sample *sampler   // of the success lines; nil writes them all
}

// NewObserver returns an observer that writes one log line per status
// transition of every delivery, with the fields operators select on
// (listed in docs/observability.md): status, message_id, idempotency_key, namespace,
// queue, worker_id, attempt, redelivered, delivery_count, lock_key,
// lock_result and lock_fence (when the Redis lock set them), fence (the
// inbox claim's fence, once the inbox set it), duration since receipt,
// and error. Durations (duration, delay) are numbers of seconds, whatever
// the handler, so that queries over the lines do not depend on it.
//
// Every text that may come from a payload (the error, which for a decode
// failure quotes the input, the idempotency key and the lock key) is cut
// to 1 KiB, ending with a "… [truncated from N bytes]" marker, so one line
// stays small whatever a producer sent. No line carries a stack trace:
// these are expected outcomes, and the stack would only show the
// observer's own call path (a handler that adds stacks by level, as
// zapslog does at error by default, should be told not to). The
// consumer's last guard logs a panic's stack.
//
// The settlement line (completed, duplicate, retry, failed, dead_lettered
// or requeued) is written from the outcome, with the reason the consumer
// settled on: the one x-error and the dead_lettered_total and
// job_retry_total labels carry. Status retry is a broker retry (a copy
// went to a delay tier; the line has its delay); retry_in_process is an
// in-process retry (the line has the pause before the next try). The
// received line is written once the payload is decoded, so it carries the
// key; an undecodable delivery's has none.
//
// Levels: received, locked, processing and completed are written at
// opts.SuccessLevel and sampled (per status: the first SampleFirst of
// each SampleInterval, then one in SampleThereafter); duplicate lines
// (with duplicate_source, the layer that caught it, duplicate_origin,
// where it came from — replay, redelivery, retry or resend — and no error
// field: a duplicate is routine) are written at info, retry, retry_in_process,
// lock_failed and requeued at warn, failed, dead_lettered and lock_expired
// at error — and none of these is ever sampled. Settle failures and broker
// connection changes are logged too. A line whose level the logger does
// not enable costs no allocation. A nil logger discards every line.
//
// Give it to the consumer as one of its observers. Use a JSON handler
// (slog.NewJSONHandler, or zap's through zapslog) so the lines are
// queryable with jq, as the runbook does.
func NewObserver(logger *slog.Logger, opts *Opts) inboxtype.Observer {
	o := opts.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	l := &logObserver{logger: logger, level: o.SuccessLevel}
	if o.SampleFirst > 0 {
		l.sample = &sampler{
			interval:   o.SampleInterval.Nanoseconds(),
			first:      uint64(o.SampleFirst),
			thereafter: uint64(o.SampleThereafter),
		}
	}
	return l
}

var _ inboxtype.Observer = (*logObserver)(nil)

// OnTransition writes the line of one transition, except the settlement
// statuses: OnOutcome writes those, with the decision the consumer settled
// on.
func (l *logObserver) OnTransition(d *inboxtype.Delivery, status inboxtype.Status, err error) {
	switch status {
	case inboxtype.StatusCompleted, inboxtype.StatusDuplicate, inboxtype.StatusRetry,
		inboxtype.StatusFailed, inboxtype.StatusDeadLettered, inboxtype.StatusRequeued:
		return
	}
	ctx := context.Background()
	lvl, ok := l.check(ctx, status)
	if !ok {
		return
	}
	attrs := make([]slog.Attr, 0, 16)
	attrs = append(attrs, slog.String(logFieldStatus, string(status)))
	attrs = deliveryAttrs(attrs, d)
	attrs = append(attrs, seconds(logFieldDuration, time.Since(d.ReceivedAt)))
	attrs = appendError(attrs, err)
	l.logger.LogAttrs(ctx, lvl, deliveryMessage(status), attrs...)
}

// OnOutcome writes the settlement line (status from [inboxtype.Outcome.Status])
// with the reason of the decision the consumer settled on, never a
// classification of its own: a route's Rules, and the policy that turns a
// last failed attempt into reason exhausted, decide. A broker retry's line
// names its delay tier. When settling failed (the ack or republish returned
// an error, or the delivery was abandoned) a "delivery settle failed" line
// follows.
func (l *logObserver) OnOutcome(d *inboxtype.Delivery, o inboxtype.Outcome) {
	ctx := context.Background()
	status := o.Status()
	if lvl, ok := l.check(ctx, status); ok {
		attrs := make([]slog.Attr, 0, 18)
		attrs = append(attrs, slog.String(logFieldStatus, string(status)))
		attrs = deliveryAttrs(attrs, d)
		attrs = append(attrs, seconds(logFieldDuration, o.Duration))
		switch o.Decision.Kind {
		case retry.KindSucceeded:
		case retry.KindDuplicate:
			attrs = append(attrs, slog.String(logFieldSource, duplicateSource(o.Decision)),
				slog.String(logFieldOrigin, duplicateOrigin(d)))
		default:
			attrs = append(attrs, slog.String(logFieldReason, o.Decision.Reason))
		}
		if o.Action == inboxtype.ActionRetried {
			attrs = append(attrs, seconds(logFieldDelay, o.Delay))
		}
		err := o.Decision.Err
		if o.Decision.Kind == retry.KindDuplicate {
			err = nil // routine: no error field for a query to page on
		}
		if o.Err != nil {
			err = o.Err
		}
		attrs = appendError(attrs, err)
		l.logger.LogAttrs(ctx, lvl, deliveryMessage(status), attrs...)
	}
	if o.Err == nil && o.Action != inboxtype.ActionAbandoned {
		return
	}
	if !l.logger.Enabled(ctx, slog.LevelError) {
		return
	}
	attrs := make([]slog.Attr, 0, 16)
	attrs = append(attrs, slog.String(logFieldAction, string(o.Action)))
	attrs = deliveryAttrs(attrs, d)
	attrs = append(attrs,
		seconds(logFieldDuration, o.Duration),
		slog.String(logFieldReason, o.Decision.Reason))
	attrs = appendError(attrs, o.Err)
	l.logger.LogAttrs(ctx, slog.LevelError, "delivery settle failed", attrs...)
}

// OnInProcessRetry writes a warn line per in-process retry (status
// retry_in_process, never sampled).
func (l *logObserver) OnInProcessRetry(d *inboxtype.Delivery, dec retry.Decision, delay time.Duration) {
	ctx := context.Background()
	lvl, ok := l.check(ctx, inboxtype.StatusRetryInProcess)
	if !ok {
		return
	}
	attrs := make([]slog.Attr, 0, 16)
	attrs = append(attrs, slog.String(logFieldStatus, string(inboxtype.StatusRetryInProcess)))
	attrs = deliveryAttrs(attrs, d)
	attrs = append(attrs,
		slog.String(logFieldReason, dec.Reason),
		seconds(logFieldDelay, delay))
	attrs = appendError(attrs, dec.Err)
	l.logger.LogAttrs(ctx, lvl, deliveryMessage(inboxtype.StatusRetryInProcess), attrs...)
}

// check returns the level of a "delivery <status>" line, and whether to
// write it: false when the logger does not enable that level, or when a
// success line is sampled away.
func (l *logObserver) check(ctx context.Context, status inboxtype.Status) (slog.Level, bool) {
	switch status {
	case inboxtype.StatusReceived, inboxtype.StatusLocked, inboxtype.StatusProcessing, inboxtype.StatusCompleted:
		if !l.logger.Enabled(ctx, l.level) {
			return l.level, false
		}
		return l.level, l.sample == nil || l.sample.keep(status)
	case inboxtype.StatusRetry, inboxtype.StatusRetryInProcess, inboxtype.StatusLockFailed, inboxtype.StatusRequeued:
		return slog.LevelWarn, l.logger.Enabled(ctx, slog.LevelWarn)
	case inboxtype.StatusFailed, inboxtype.StatusDeadLettered, inboxtype.StatusLockExpired:
		return slog.LevelError, l.logger.Enabled(ctx, slog.LevelError)
	default:
		return slog.LevelInfo, l.logger.Enabled(ctx, slog.LevelInfo)
	}
}

// OnConnState logs broker connection changes: connected and stopped at
// info, disconnected at warn with the cause.
func (l *logObserver) OnConnState(state inboxtype.ConnState, err error) {
	ctx := context.Background()
	lvl := slog.LevelInfo
	if state == inboxtype.ConnDisconnected {
		lvl = slog.LevelWarn
	}
	if !l.logger.Enabled(ctx, lvl) {
		return
	}
	if err != nil {
		l.logger.LogAttrs(ctx, lvl, "broker "+string(state), slog.String("state", string(state)), errorAttr(err))
		return
	}
	l.logger.LogAttrs(ctx, lvl, "broker "+string(state), slog.String("state", string(state)))
}

func deliveryAttrs(attrs []slog.Attr, d *inboxtype.Delivery) []slog.Attr {
	attrs = append(attrs,
		slog.String(logFieldMessageID, d.MessageID),
		slog.String(logFieldIdempotencyKey, clip.Text(d.Key, clip.Limit)),
		slog.String(logFieldNamespace, d.Namespace),
		slog.String(logFieldQueue, d.Queue),
		slog.String(logFieldWorkerID, d.WorkerID),
		slog.Int(logFieldAttempt, d.Attempt),
		slog.Bool(logFieldRedelivered, d.Redelivered),
	)
	if d.DeliveryCount > 0 {
		attrs = append(attrs, slog.Int(logFieldDeliveryCount, d.DeliveryCount))
	}
	if d.LockKey != "" {
		attrs = append(attrs, slog.String(logFieldLockKey, clip.Text(d.LockKey, clip.Limit)))
	}
	if d.LockResult != "" {
		attrs = append(attrs, slog.String(logFieldLockResult, d.LockResult))
	}
	if d.LockFence != 0 {
		attrs = append(attrs, slog.Int64(logFieldLockFence, d.LockFence))
	}
	if d.InboxFence != 0 {
		attrs = append(attrs, slog.Int64(logFieldFence, d.InboxFence))
	}
	return attrs
}

// seconds is d as a number of seconds, the unit docs/observability.md
// gives for duration and delay.
func seconds(key string, d time.Duration) slog.Attr {
	return slog.Float64(key, d.Seconds())
}

// appendError adds the error's text, cut to clip.Limit; nothing for nil.
func appendError(attrs []slog.Attr, err error) []slog.Attr {
	if err == nil {
		return attrs
	}
	return append(attrs, errorAttr(err))
}

// errorAttr is err's text, cut to clip.Limit.
func errorAttr(err error) slog.Attr {
	return slog.String(logFieldError, clip.Text(err.Error(), clip.Limit))
}

// deliveryMessages are the messages of the statuses, built once so that a
// line costs no concatenation.
var deliveryMessages = func() map[inboxtype.Status]string {
	m := map[inboxtype.Status]string{}
	for _, s := range []inboxtype.Status{
		inboxtype.StatusReceived, inboxtype.StatusLocked, inboxtype.StatusProcessing, inboxtype.StatusCompleted,
		inboxtype.StatusDuplicate, inboxtype.StatusRetry, inboxtype.StatusRetryInProcess, inboxtype.StatusFailed,
		inboxtype.StatusDeadLettered, inboxtype.StatusRequeued, inboxtype.StatusLockFailed,
		inboxtype.StatusLockExpired, inboxtype.StatusParked,
	} {
		m[s] = "delivery " + string(s)
	}
	return m
}()

// deliveryMessage is the message of a status's line: "delivery <status>".
func deliveryMessage(status inboxtype.Status) string {
	if msg, ok := deliveryMessages[status]; ok {
		return msg
	}
	return "delivery " + string(status)
}

// sampler decides which success lines are written: per status and per
// interval, the first `first` lines, then one in `thereafter`.
type sampler struct {
	interval   int64 // nanoseconds
	first      uint64
	thereafter uint64
	// windows holds the count of each success status, in the order of
	// successIndex.
	windows [4]window
}

// window counts the lines of one status in the current interval.
type window struct {
	end atomic.Int64 // UnixNano at which the interval ends
	n   atomic.Uint64
}

// successIndex is the index of a success status in sampler.windows.
func successIndex(status inboxtype.Status) int {
	switch status {
	case inboxtype.StatusReceived:
		return 0
	case inboxtype.StatusLocked:
		return 1
	case inboxtype.StatusProcessing:
		return 2
	default: // completed
		return 3
	}
}

// keep counts a line of status and reports whether to write it.
func (s *sampler) keep(status inboxtype.Status) bool {
	n := s.windows[successIndex(status)].count(time.Now().UnixNano(), s.interval)
	return n <= s.first || (n-s.first)%s.thereafter == 0
}

// count adds one line at now and returns how many the interval has had,
// starting a new interval once the last one ended. Lines racing a new
// interval's start may be counted in the old one: sampling is approximate
// by nature.
func (w *window) count(now, interval int64) uint64 {
	end := w.end.Load()
	if now < end {
		return w.n.Add(1)
	}
	if w.end.CompareAndSwap(end, now+interval) {
		w.n.Store(1)
		return 1
	}
	return w.n.Add(1)
}

// duplicateOrigin names where a duplicate came from: a replay from the
// DLQ (x-replay-count), the broker's redelivery of a delivery it had
// handed out (the redelivered flag, a quorum queue's delivery count), a
// retry copy of a job that has meanwhile completed (x-attempt above 1),
// else a resend: the producer sent the job again, or another message
// carries the same job.
func duplicateOrigin(d *inboxtype.Delivery) string {
	switch {
	case d.Raw != nil && inboxtype.HeaderInt(d.Raw.Headers, inboxtype.HeaderReplayCount) > 0:
		return "replay"
	case d.Redelivered || d.DeliveryCount > 0:
		return "redelivery"
	case d.Attempt > 1:
		return "retry"
	default:
		return "resend"
	}
}

// duplicateSource names where a duplicate was caught: the decision's
// source (a *retry.DuplicateError names it), else the inbox's (a bare
// retry.ErrDuplicate, or a Rule that named none).
func duplicateSource(dec retry.Decision) string {
	var dup *retry.DuplicateError
	switch {
	case dec.Source != "":
		return dec.Source
	case errors.As(dec.Err, &dup) && dup.Source != "":
		return dup.Source
	default:
		return retry.SourceInbox
	}
}
