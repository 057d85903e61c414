package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
)

// AMQP queue arguments that inboxmq sets.
const (
	argQueueType        = "x-queue-type"
	argDeliveryLimit    = "x-delivery-limit"
	argDLX              = "x-dead-letter-exchange"
	argDLRoutingKey     = "x-dead-letter-routing-key"
	argDLStrategy       = "x-dead-letter-strategy"
	argOverflow         = "x-overflow"
	argMessageTTL       = "x-message-ttl"
	strategyAtLeastOnce = "at-least-once"
	overflowRejectPub   = "reject-publish"
)

// reservedArgs are managed by inboxmq; QueueOpts.Arguments may not set them
// to anything else, because they decide whether a message can be dropped.
var reservedArgs = []string{argQueueType, argDeliveryLimit, argDLX, argDLRoutingKey, argDLStrategy, argOverflow}

// validateTopology checks the safety rules of a queue's topology: nothing
// may be configured to drop messages silently.
func (o HandlerOpts) validateTopology(queue string) error {
	if err := o.validate(queue); err != nil {
		return err
	}
	q := o.Queue
	if q.Type == Quorum && q.DeliveryLimit <= 0 {
		return fmt.Errorf("consumer: quorum queue %q needs a positive DeliveryLimit (got %d): without one a crash loop never ends", queue, q.DeliveryLimit)
	}
	for _, a := range reservedArgs {
		if _, ok := q.Arguments[a]; ok {
			return fmt.Errorf("consumer: queue %q: argument %s is managed by inboxmq (it decides whether messages can be dropped); remove it from QueueOpts.Arguments", queue, a)
		}
	}
	// Every work queue dead-letters into its DLQ, so a TTL or a length
	// limit moves messages there (with the broker's x-death reason); only a
	// queue that expires would take its messages with it.
	if _, ok := q.Arguments["x-expires"]; ok {
		return fmt.Errorf("consumer: queue %q: x-expires would delete the queue with its messages; remove it from QueueOpts.Arguments", queue)
	}
	for _, tier := range q.RetryTiers {
		if n := inboxtype.RetryQueue(queue, tier); !ValidName(n) {
			return fmt.Errorf("consumer: retry queue name %q is invalid", n)
		}
	}
	return nil
}

// deadQueueName is the queue into which the broker dead-letters a route's
// messages (expired, over the delivery limit, rejected, pushed out by a
// length limit). The consumer files each one into the DLQ as it files its
// own dead letters: with the reason in x-error and the route's
// OnDeadLetter hook, so that every message in the DLQ went through one
// settlement.
func deadQueueName(queue string) string { return queue + ".dead" }

// workQueueArgs are the arguments of the work queue. Every work queue
// dead-letters through the default exchange into its dead queue
// (deadQueueName), so a message the broker expires, rejects or drops for
// a length limit is never lost and reaches the DLQ through the consumer.
func workQueueArgs(queue string, q QueueOpts) amqp.Table {
	args := amqp.Table{}
	for k, v := range q.Arguments {
		args[k] = v
	}
	args[argQueueType] = string(q.Type)
	args[argDLX] = ""
	args[argDLRoutingKey] = deadQueueName(queue)
	if q.Type == Quorum {
		args[argDeliveryLimit] = int64(q.DeliveryLimit)
		args[argDLStrategy] = strategyAtLeastOnce
		args[argOverflow] = overflowRejectPub
	}
	return args
}

// deadQueueArgs are the arguments of the dead queue: a message the
// consumer cannot file (it crashes the worker at every try) goes straight
// to the DLQ once the broker has counted its deliveries.
func deadQueueArgs(q QueueOpts) amqp.Table {
	args := amqp.Table{
		argQueueType:    string(q.Type),
		argDLX:          "",
		argDLRoutingKey: q.DeadLetterQueue,
	}
	if q.Type == Quorum {
		args[argDeliveryLimit] = int64(q.DeliveryLimit)
		args[argDLStrategy] = strategyAtLeastOnce
		args[argOverflow] = overflowRejectPub
	}
	return args
}

// queueDecl is one queue of a route's topology.
type queueDecl struct {
	name string
	args amqp.Table
}

// topology lists the queues of a route: the DLQ first, the dead queue
// (the work queue dead-letters into it, and it into the DLQ), the work
// queue, then one wait queue per tier.
func topology(queue string, q QueueOpts) []queueDecl {
	typ := string(q.Type)
	dlq := amqp.Table{argQueueType: typ}
	out := []queueDecl{
		{name: q.DeadLetterQueue, args: dlq},
		{name: deadQueueName(queue), args: deadQueueArgs(q)},
		{name: queue, args: workQueueArgs(queue, q)},
	}
	for _, tier := range q.RetryTiers {
		args := amqp.Table{
			argQueueType:    typ,
			argMessageTTL:   int64(tier / time.Millisecond),
			argDLX:          "",
			argDLRoutingKey: queue,
		}
		if q.Type == Quorum {
			args[argDLStrategy] = strategyAtLeastOnce
			args[argOverflow] = overflowRejectPub
		}
		out = append(out, queueDecl{name: inboxtype.RetryQueue(queue, tier), args: args})
	}
	return out
}

var inequivalentArg = regexp.MustCompile(`inequivalent arg '([^']+)'`)

// declareTopology declares every queue of the route (see declareRoute).
func declareTopology(conn *amqp.Connection, r Route) error {
	_, err := declareRoute(conn, r)
	return err
}

// declared says how a route's topology was found on the broker.
type declared struct {
	// legacy: the classic work queue exists as declared before v0.1.0,
	// without a dead-letter route (kept as it is).
	legacy bool
	// direct: the work queue (or a shard) exists as v0.1.0 declared it,
	// dead-lettering straight into the DLQ instead of the dead queue (kept
	// as it is).
	direct bool
	// kept is the queue type the route's queues already had when it
	// differs from the configured one ("" when they match): the topology
	// was declared with that type instead.
	kept QueueType
}

// workShape is how declareWork found a work queue.
type workShape int

const (
	shapeCurrent workShape = iota // as configured
	shapeDirect                   // v0.1.0: dead-letters straight into the DLQ
	shapeLegacy                   // before v0.1.0: no dead-letter route (classic)
)

// declareRoute declares every queue of the route, the DLQ first. Each
// declaration uses its own channel, because a PRECONDITION_FAILED closes
// the channel.
//
// A work queue that already exists with the other queue type (classic for
// a Quorum route, or the reverse) decides the type of the whole topology:
// the broker cannot change a queue's type, and refusing to start would
// crash-loop every worker of an upgrade. The caller warns with the
// migration. A classic work queue declared before v0.1.0, without a
// dead-letter route, is kept too (its arguments cannot change by declaring
// it again) and the caller warns.
func declareRoute(conn *amqp.Connection, r Route) (declared, error) {
	q := r.Opts.Queue
	if q.NoDeclare {
		return declared{}, nil
	}
	if o := r.Opts.Ordered; o != nil {
		// No work queue and no delay tiers: the shard queues take the
		// work queue's place and retries run in process.
		if err := declareQueue(conn, queueDecl{name: q.DeadLetterQueue, args: amqp.Table{argQueueType: string(q.Type)}}); err != nil {
			return declared{}, err
		}
		if err := declareQueue(conn, queueDecl{name: deadQueueName(r.Queue), args: deadQueueArgs(q)}); err != nil {
			return declared{}, err
		}
		direct, err := declareOrdered(conn, r.Queue, q, o)
		return declared{direct: direct}, err
	}
	var out declared
	if kept, ok := existingOtherType(conn, r.Queue, q); ok {
		q.Type, out.kept = kept, kept
	}
	for _, qd := range topology(r.Queue, q) {
		var err error
		if qd.name == r.Queue {
			var shape workShape
			shape, err = declareWork(conn, qd, q)
			out.legacy, out.direct = shape == shapeLegacy, shape == shapeDirect
		} else {
			err = declareQueue(conn, qd)
		}
		if typeMismatch(err) {
			return declared{}, fmt.Errorf("%w (a queue's type cannot change: see docs/operations.md, \"Changing a queue's type\")", err)
		}
		if err != nil {
			return declared{}, err
		}
	}
	return out, nil
}

// declareWork declares the work queue (or shard queue) qd of a route with
// queue options q. A queue that exists in an older shape is declared as
// it is, and the shape says which: v0.1.0's, which dead-letters straight
// into the DLQ, or (classic only) the pre-v0.1.0 one without a
// dead-letter route.
func declareWork(conn *amqp.Connection, qd queueDecl, q QueueOpts) (workShape, error) {
	err := declareQueue(conn, qd)
	if !lacksDeadLetterRoute(err) {
		return shapeCurrent, err
	}
	// Each older shape in turn; when none fits, the error that names an
	// argument other than the dead-letter route says what really differs.
	direct := queueDecl{name: qd.name, args: cloneTable(qd.args)}
	direct.args[argDLRoutingKey] = q.DeadLetterQueue
	errDirect := declareQueue(conn, direct)
	if errDirect == nil {
		return shapeDirect, nil
	}
	if !lacksDeadLetterRoute(errDirect) {
		return shapeCurrent, errDirect
	}
	if q.Type == Classic {
		old := queueDecl{name: qd.name, args: cloneTable(qd.args)}
		delete(old.args, argDLX)
		delete(old.args, argDLRoutingKey)
		errLegacy := declareQueue(conn, old)
		if errLegacy == nil {
			return shapeLegacy, nil
		}
		if !lacksDeadLetterRoute(errLegacy) {
			return shapeCurrent, errLegacy
		}
	}
	return shapeCurrent, err
}

// existingOtherType reports the other queue type when the work queue
// exists, refuses q's arguments and accepts those of the other type.
func existingOtherType(conn *amqp.Connection, queue string, q QueueOpts) (QueueType, bool) {
	if !queueExists(conn, queue) {
		return "", false
	}
	_, err := declareWork(conn, queueDecl{name: queue, args: workQueueArgs(queue, q)}, q)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return "", false
	}
	other := q
	other.Type = Classic
	if q.Type == Classic {
		other.Type = Quorum
	}
	if _, err := declareWork(conn, queueDecl{name: queue, args: workQueueArgs(queue, other)}, other); err != nil {
		return "", false
	}
	return other.Type, true
}

// queueExists reports whether queue exists (a passive declaration).
func queueExists(conn *amqp.Connection, queue string) bool {
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	defer func() { _ = ch.Close() }()
	_, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return err == nil
}

// typeMismatch reports whether err is the broker refusing a declaration
// because the existing queue has another x-queue-type.
func typeMismatch(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return false
	}
	m := inequivalentArg.FindStringSubmatch(ae.Reason)
	return m != nil && m[1] == argQueueType
}

// warnKeptType logs that route's queues exist with another type than
// configured and were kept, with the way to migrate.
func warnKeptType(log *slog.Logger, r Route, kept QueueType) {
	log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: queue exists with another type than configured; "+
		"it is kept with its type (the broker cannot change a queue's type). "+
		"To migrate, see docs/operations.md, \"Changing a queue's type\": drain the queue and delete its topology, "+
		"or move to a new queue name",
		slog.String("queue", r.Queue), slog.String("existing_type", string(kept)),
		slog.String("configured_type", string(r.Opts.Queue.Type)))
}

// lacksDeadLetterRoute reports whether err is the broker refusing a
// declaration because the existing queue's dead-letter arguments differ.
func lacksDeadLetterRoute(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return false
	}
	m := inequivalentArg.FindStringSubmatch(ae.Reason)
	return m != nil && (m[1] == argDLX || m[1] == argDLRoutingKey)
}

// warnLegacyQueue logs that route's work queue has no dead-letter route of
// its own, with the policy that gives it one.
func warnLegacyQueue(log *slog.Logger, vhost string, r Route) {
	dead := deadQueueName(r.Queue)
	policy := fmt.Sprintf(`rabbitmqctl set_policy -p %s %s %s '{"dead-letter-exchange":"","dead-letter-routing-key":"%s"}' --apply-to queues`,
		shellQuote(cmp.Or(vhost, "/")), shellQuote(r.Queue+"-dlx"), shellQuote("^"+regexp.QuoteMeta(r.Queue)+"$"), dead)
	log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: work queue was declared before v0.1.0 without a dead-letter route; "+
		"unless a policy gives it one, a message that expires or is rejected there is dropped, not moved to the DLQ. "+
		"Apply the policy in migration (see docs/operations.md), or delete the queue once it is empty so that the consumer declares it anew",
		slog.String("queue", r.Queue), slog.String("dead_letter_queue", r.Opts.Queue.DeadLetterQueue),
		slog.String("dead_queue", dead), slog.String("migration", policy))
}

// warnDirectQueue logs that route's work queue (or a shard) dead-letters
// straight into the DLQ, as v0.1.0 declared it: what the broker
// dead-letters there carries no reason header and runs no OnDeadLetter
// hook (no fault event). A queue's arguments cannot change and a policy
// does not override them, so the way out is a new queue.
func warnDirectQueue(log *slog.Logger, r Route) {
	log.LogAttrs(context.Background(), slog.LevelWarn, "consumer: work queue was declared by inboxmq 0.1.0 and dead-letters straight into its DLQ; "+
		"messages the broker dead-letters there (expired, over the delivery limit) reach the DLQ without the worker: no x-error reason, no OnDeadLetter hook, no fault event. "+
		"The broker cannot change a queue's arguments: drain the queue and delete it so that the consumer declares it anew, or move to a new queue name (see docs/operations.md)",
		slog.String("queue", r.Queue), slog.String("dead_letter_queue", r.Opts.Queue.DeadLetterQueue),
		slog.String("dead_queue", deadQueueName(r.Queue)))
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func declareQueue(conn *amqp.Connection, qd queueDecl) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("consumer: open channel to declare %q: %w", qd.name, err)
	}
	defer func() { _ = ch.Close() }()
	if _, err := ch.QueueDeclare(qd.name, true, false, false, false, qd.args); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			arg := "an argument"
			if m := inequivalentArg.FindStringSubmatch(ae.Reason); m != nil {
				arg = "argument " + m[1]
			}
			return fmt.Errorf("consumer: queue %q already exists with a different %s than configured (delete it or align QueueOpts): %w", qd.name, arg, err)
		}
		return fmt.Errorf("consumer: declare queue %q: %w", qd.name, err)
	}
	return nil
}

// QueueSpec is one queue of a route's topology as the consumer declares
// it (for the topology lint).
type QueueSpec struct {
	Name string
	// Role is "work", "dead", "retry" or "dlq".
	Role string
	Args amqp.Table
	// Consumed says whether the consumer consumes the queue.
	Consumed bool
}

// Topology returns the queues the consumer declares for the route of
// queue, with their arguments, defaults applied; nil for a queue with no
// route. An ordered route's shard queues are not listed.
func (rt *Router) Topology(queue string) []QueueSpec {
	rt.mu.Lock()
	reg := rt.routes[queue]
	rt.mu.Unlock()
	if reg == nil {
		return nil
	}
	return topologyOf(queue, reg.opts)
}

// Topology returns the queues a route of queue with opts declares, with
// their arguments, as [Router.Topology] does for a registered route.
func Topology(queue string, opts *HandlerOpts) []QueueSpec {
	return topologyOf(queue, opts.withDefaults(queue))
}

func topologyOf(queue string, opts HandlerOpts) []QueueSpec {
	q := opts.Queue
	if opts.Ordered != nil {
		return []QueueSpec{
			{Name: q.DeadLetterQueue, Role: "dlq", Args: amqp.Table{argQueueType: string(q.Type)}},
			{Name: deadQueueName(queue), Role: "dead", Args: deadQueueArgs(q), Consumed: true},
		}
	}
	var out []QueueSpec
	for i, qd := range topology(queue, q) {
		s := QueueSpec{Name: qd.name, Args: qd.args, Role: "retry"}
		switch {
		case i == 0:
			s.Role = "dlq"
		case qd.name == deadQueueName(queue):
			s.Role, s.Consumed = "dead", true
		case qd.name == queue:
			s.Role, s.Consumed = "work", true
		}
		out = append(out, s)
	}
	return out
}
