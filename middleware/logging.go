package middleware

import (
	"errors"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/clip"
	"github.com/inboxmq/inboxmq/retry"
)

// Log field names written by [NewLogObserver]. They are stable: the runbook's
// jq queries and log-based dashboards select on them. docs/observability.md
// lists them; that list is the contract.
const (
	logFieldStatus         = "status"
	logFieldMessageID      = "message_id"
	logFieldIdempotencyKey = "idempotency_key"
	logFieldConsumer       = "consumer"
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
	logFieldReason         = "reason"
	logFieldAction         = "action"
	logFieldDelay          = "delay"
	logFieldError          = "error"
)

// LogOpts configures [NewLogObserver]. A nil *LogOpts means all defaults.
type LogOpts struct {
	// SuccessLevel is the level of the per-delivery success lines (received,
	// locked, processing, completed). Defaults to zapcore.InfoLevel (the zero
	// value).
	SuccessLevel zapcore.Level
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

func (o *LogOpts) withDefaults() LogOpts {
	var out LogOpts
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
	all     *zap.Logger // never sampled: failures, retries, duplicates, dead letters
	success *zap.Logger // sampled: received, locked, processing, completed
	level   zapcore.Level
}

// NewLogObserver returns an observer that writes one log line per status
// transition of every delivery, with the fields operators select on
// (listed in docs/observability.md): status, message_id, idempotency_key, consumer,
// queue, worker_id, attempt, redelivered, delivery_count, lock_key,
// lock_result and lock_fence (when the Redis lock set them), fence (the
// inbox claim's fence, once the inbox set it), duration since receipt,
// and error.
//
// Every text that may come from a payload (the error, which for a decode
// failure quotes the input, the idempotency key and the lock key) is cut
// to 1 KiB, ending with a "… [truncated from N bytes]" marker, so one line
// stays small whatever a producer sent. No line carries a stack trace,
// whatever the logger's stack-trace level (zap's production configuration
// adds one at error): these are expected outcomes, and the stack would
// only show the observer's own call path. The consumer's last guard logs a panic's stack.
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
// opts.SuccessLevel and sampled (per status, zap's sampler); duplicate lines
// (with duplicate_source) are written at info, retry, retry_in_process,
// lock_failed and requeued at warn, failed, dead_lettered and lock_expired
// at error — and none of these is ever sampled. Settle failures and broker
// connection changes are logged too. A nil logger means zap.NewNop().
//
// Give it to the consumer as one of its observers. Use a JSON encoder
// (zap.NewProduction) so the lines are queryable with jq, as the runbook
// does.
func NewLogObserver(logger *zap.Logger, opts *LogOpts) inboxtype.Observer {
	o := opts.withDefaults()
	if logger == nil {
		logger = zap.NewNop()
	}
	logger = logger.WithOptions(zap.AddStacktrace(noStacktrace))
	success := logger
	if o.SampleFirst > 0 {
		success = logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, o.SampleInterval, o.SampleFirst, o.SampleThereafter)
		}))
	}
	return &logObserver{all: logger, success: success, level: o.SuccessLevel}
}

var _ inboxtype.Observer = (*logObserver)(nil)

// noStacktrace enables stack traces at no level.
var noStacktrace = zap.LevelEnablerFunc(func(zapcore.Level) bool { return false })

// OnTransition writes the line of one transition, except the settlement
// statuses: OnOutcome writes those, with the decision the consumer settled
// on.
func (l *logObserver) OnTransition(d *inboxtype.Delivery, status inboxtype.Status, err error) {
	switch status {
	case inboxtype.StatusCompleted, inboxtype.StatusDuplicate, inboxtype.StatusRetry,
		inboxtype.StatusFailed, inboxtype.StatusDeadLettered, inboxtype.StatusRequeued:
		return
	}
	ce := l.check(status)
	if ce == nil {
		return
	}
	fields := make([]zap.Field, 0, 16)
	fields = append(fields, zap.String(logFieldStatus, string(status)))
	fields = deliveryFields(fields, d)
	fields = append(fields, zap.Duration(logFieldDuration, time.Since(d.ReceivedAt)), errorField(err))
	ce.Write(fields...)
}

// OnOutcome writes the settlement line (status from [inboxtype.Outcome.Status])
// with the reason of the decision the consumer settled on, never a
// classification of its own: a route's Rules, and the policy that turns a
// last failed attempt into reason exhausted, decide. A broker retry's line
// names its delay tier. When settling failed (the ack or republish returned
// an error, or the delivery was abandoned) a "delivery settle failed" line
// follows.
func (l *logObserver) OnOutcome(d *inboxtype.Delivery, o inboxtype.Outcome) {
	status := o.Status()
	if ce := l.check(status); ce != nil {
		fields := make([]zap.Field, 0, 18)
		fields = append(fields, zap.String(logFieldStatus, string(status)))
		fields = deliveryFields(fields, d)
		fields = append(fields, zap.Duration(logFieldDuration, o.Duration))
		switch o.Decision.Kind {
		case retry.KindSucceeded:
		case retry.KindDuplicate:
			fields = append(fields, zap.String(logFieldSource, duplicateSource(o.Decision)))
		default:
			fields = append(fields, zap.String(logFieldReason, o.Decision.Reason))
		}
		if o.Action == inboxtype.ActionRetried {
			fields = append(fields, zap.Duration(logFieldDelay, o.Delay))
		}
		err := o.Decision.Err
		if o.Err != nil {
			err = o.Err
		}
		ce.Write(append(fields, errorField(err))...)
	}
	if o.Err == nil && o.Action != inboxtype.ActionAbandoned {
		return
	}
	ce := l.all.Check(zapcore.ErrorLevel, "delivery settle failed")
	if ce == nil {
		return
	}
	fields := make([]zap.Field, 0, 16)
	fields = append(fields, zap.String(logFieldAction, string(o.Action)))
	fields = deliveryFields(fields, d)
	fields = append(fields,
		zap.Duration(logFieldDuration, o.Duration),
		zap.String(logFieldReason, o.Decision.Reason),
		errorField(o.Err))
	ce.Write(fields...)
}

// OnInProcessRetry writes a warn line per in-process retry (status
// retry_in_process, never sampled).
func (l *logObserver) OnInProcessRetry(d *inboxtype.Delivery, dec retry.Decision, delay time.Duration) {
	ce := l.check(inboxtype.StatusRetryInProcess)
	if ce == nil {
		return
	}
	fields := make([]zap.Field, 0, 16)
	fields = append(fields, zap.String(logFieldStatus, string(inboxtype.StatusRetryInProcess)))
	fields = deliveryFields(fields, d)
	fields = append(fields,
		zap.String(logFieldReason, dec.Reason),
		zap.Duration(logFieldDelay, delay),
		errorField(dec.Err))
	ce.Write(fields...)
}

// check returns the entry of a "delivery <status>" line at the status's
// level, through the sampled logger for success statuses; nil when that
// level is disabled or the line is sampled away.
func (l *logObserver) check(status inboxtype.Status) *zapcore.CheckedEntry {
	logger, lvl := l.all, zapcore.InfoLevel
	switch status {
	case inboxtype.StatusReceived, inboxtype.StatusLocked, inboxtype.StatusProcessing, inboxtype.StatusCompleted:
		logger, lvl = l.success, l.level
	case inboxtype.StatusRetry, inboxtype.StatusRetryInProcess, inboxtype.StatusLockFailed, inboxtype.StatusRequeued:
		lvl = zapcore.WarnLevel
	case inboxtype.StatusFailed, inboxtype.StatusDeadLettered, inboxtype.StatusLockExpired:
		lvl = zapcore.ErrorLevel
	}
	return logger.Check(lvl, "delivery "+string(status))
}

// OnConnState logs broker connection changes: connected and stopped at
// info, disconnected at warn with the cause.
func (l *logObserver) OnConnState(state inboxtype.ConnState, err error) {
	lvl := zapcore.InfoLevel
	if state == inboxtype.ConnDisconnected {
		lvl = zapcore.WarnLevel
	}
	ce := l.all.Check(lvl, "broker "+string(state))
	if ce == nil {
		return
	}
	if err != nil {
		ce.Write(zap.String("state", string(state)), errorField(err))
		return
	}
	ce.Write(zap.String("state", string(state)))
}

func deliveryFields(fields []zap.Field, d *inboxtype.Delivery) []zap.Field {
	fields = append(fields,
		zap.String(logFieldMessageID, d.MessageID),
		zap.String(logFieldIdempotencyKey, clip.Text(d.Key, clip.Limit)),
		zap.String(logFieldConsumer, d.Namespace),
		zap.String(logFieldQueue, d.Queue),
		zap.String(logFieldWorkerID, d.WorkerID),
		zap.Int(logFieldAttempt, d.Attempt),
		zap.Bool(logFieldRedelivered, d.Redelivered),
	)
	if d.DeliveryCount > 0 {
		fields = append(fields, zap.Int(logFieldDeliveryCount, d.DeliveryCount))
	}
	if d.LockKey != "" {
		fields = append(fields, zap.String(logFieldLockKey, clip.Text(d.LockKey, clip.Limit)))
	}
	if d.LockResult != "" {
		fields = append(fields, zap.String(logFieldLockResult, d.LockResult))
	}
	if d.LockFence != 0 {
		fields = append(fields, zap.Int64(logFieldLockFence, d.LockFence))
	}
	if d.InboxFence != 0 {
		fields = append(fields, zap.Int64(logFieldFence, d.InboxFence))
	}
	return fields
}

// errorField is the error's text, cut to clip.Limit; nothing for nil.
func errorField(err error) zap.Field {
	if err == nil {
		return zap.Skip()
	}
	return zap.String(logFieldError, clip.Text(err.Error(), clip.Limit))
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
