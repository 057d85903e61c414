package consumer

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ExchangeConsistentHash is the exchange type of RabbitMQ's
// rabbitmq_consistent_hash_exchange plugin, which an ordered route's
// exchange uses.
const ExchangeConsistentHash = "x-consistent-hash"

const argSingleActiveConsumer = "x-single-active-consumer"

// headerOrderingKey carries, on a dead letter of an ordered route, the
// ordering key (routing key) the message was published with, so that
// [ReplayDLQ] sends it back through the route's exchange to its shard.
const headerOrderingKey = "x-ordering-key"

// OrderedOpts spread a route over shard queues so that the messages of one
// ordering key are handled one at a time, in the order the broker received
// them, while different keys run in parallel on many workers.
//
// The route declares an exchange of type x-consistent-hash (the
// rabbitmq_consistent_hash_exchange plugin must be enabled) bound to
// Shards queues "<queue>.shard.<i>", each with single active consumer:
// producers publish to the exchange with the ordering key (an aggregate's
// id) as routing key, and every message of a key lands in the same shard.
// Each shard is consumed by one worker at a time; inside a worker a key's
// deliveries wait for the previous one to settle. Workers that join or
// leave share the shards out by themselves (see RebalanceInterval).
//
// On a Quorum route each shard channel has a prefetch of 1 (a quorum
// queue returns a departing worker's unacked messages out of order, so
// only one may be outstanding); a Classic route uses QueueOpts.Prefetch
// per shard.
//
// A retryable failure is retried in process, under HandlerOpts.Policy, and
// holds the key's later messages back until it succeeds or is
// dead-lettered after the last attempt; a dead-lettered message releases
// them (the one gap in the key's order, to be replayed from the DLQ). A
// message that is requeued instead (Stop, or a dead letter that could not
// be written) holds them back too, on both queue types: the worker returns
// what the shard handed it after that message to the queue, behind it.
// docs/ordering.md describes the guarantees and their limits.
type OrderedOpts struct {
	// Shards is the number of shard queues, hence the most workers that
	// consume the route at once. It must not change once the route has
	// messages: a key may move to another shard. Defaults to 8.
	Shards int
	// Exchange is the consistent-hash exchange producers publish to, with
	// the ordering key as routing key. Defaults to the queue name.
	Exchange string
	// RebalanceInterval is how often a worker counts the workers of the
	// route and gives up the shards it holds beyond its fair share
	// (ceil(Shards/workers)). Defaults to 5s; -1 disables rebalancing (a
	// shard then moves only when its worker stops or fails).
	RebalanceInterval time.Duration
	// MaxRetryDelay caps the pause between two in-process retries of a
	// delivery (the key's later messages wait through it). Defaults to
	// 30s.
	MaxRetryDelay time.Duration
	// Fair makes the shards tenant shards: the routing key is a tenant,
	// not an ordering key. The shard queues have no single active
	// consumer, every worker consumes every shard (no members queue, no
	// rebalancing), a tenant's deliveries run in parallel, and a worker's
	// slots are shared among the tenants with deliveries waiting in it, by
	// Weights (see fairShare). Retries run in process, as on an ordered
	// route, and hold a slot of their tenant's share.
	Fair bool
	// Weights weigh the tenants of a Fair route; a tenant not named
	// weighs 1.
	Weights map[string]int
}

func (o *OrderedOpts) withDefaults(queue string) *OrderedOpts {
	if o == nil {
		return nil
	}
	out := *o
	if out.Shards == 0 {
		out.Shards = 8
	}
	out.Exchange = cmp.Or(out.Exchange, queue)
	if out.RebalanceInterval == 0 {
		out.RebalanceInterval = 5 * time.Second
	}
	if out.MaxRetryDelay == 0 {
		out.MaxRetryDelay = 30 * time.Second
	}
	return &out
}

func (o *OrderedOpts) validate(queue string) error {
	if o == nil {
		return nil
	}
	if o.Shards < 1 || o.Shards > 1024 {
		return fmt.Errorf("consumer: queue %q: Ordered.Shards %d is out of range 1..1024", queue, o.Shards)
	}
	if !ValidName(o.Exchange) {
		return fmt.Errorf("consumer: queue %q: invalid Ordered.Exchange %q", queue, o.Exchange)
	}
	if !ValidName(ShardQueueName(queue, o.Shards-1)) || !ValidName(membersQueueName(queue)) {
		return fmt.Errorf("consumer: queue %q: name too long for its shard queues", queue)
	}
	if o.RebalanceInterval < -1 {
		return fmt.Errorf("consumer: queue %q: Ordered.RebalanceInterval %s is negative (use -1 to disable)", queue, o.RebalanceInterval)
	}
	if o.MaxRetryDelay < 0 {
		return fmt.Errorf("consumer: queue %q: Ordered.MaxRetryDelay %s is negative", queue, o.MaxRetryDelay)
	}
	for tenant, w := range o.Weights {
		if w < 1 {
			return fmt.Errorf("consumer: queue %q: the weight of tenant %q is %d; weights start at 1", queue, tenant, w)
		}
	}
	return nil
}

// ShardQueueName is the name of shard i (0-based) of an ordered route's
// queue, such as "payments.shard.3".
func ShardQueueName(queue string, i int) string {
	return queue + ".shard." + strconv.Itoa(i)
}

// membersQueueName is the queue every worker of an ordered route consumes
// to be counted: it never receives messages; its consumer count is the
// number of workers.
func membersQueueName(queue string) string { return queue + ".members" }

// declareOrdered declares an ordered route's topology: the DLQ and the
// dead queue (declared by the caller), the consistent-hash exchange, the
// shard queues with single active consumer, each bound with weight 1, and
// the members queue. Each step uses its own channel, since a refusal
// closes the channel. direct reports a shard that v0.1.0 declared, which
// dead-letters straight into the DLQ (kept as it is).
func declareOrdered(conn *amqp.Connection, queue string, q QueueOpts, o *OrderedOpts) (direct bool, err error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("consumer: open channel to declare exchange %q: %w", o.Exchange, err)
	}
	err = ch.ExchangeDeclare(o.Exchange, ExchangeConsistentHash, true, false, false, false, nil)
	_ = ch.Close()
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.CommandInvalid {
			return false, fmt.Errorf("consumer: declare exchange %q of type %s: is the rabbitmq_consistent_hash_exchange plugin enabled? "+
				"(rabbitmq-plugins enable rabbitmq_consistent_hash_exchange): %w", o.Exchange, ExchangeConsistentHash, err)
		}
		return false, fmt.Errorf("consumer: declare exchange %q: %w", o.Exchange, err)
	}
	for i := range o.Shards {
		args := workQueueArgs(queue, q)
		if !o.Fair {
			args[argSingleActiveConsumer] = true
		}
		name := ShardQueueName(queue, i)
		shape, err := declareWork(conn, queueDecl{name: name, args: args}, q)
		if err != nil {
			return false, err
		}
		direct = direct || shape == shapeDirect
		if err := bindShard(conn, name, o.Exchange); err != nil {
			return false, err
		}
	}
	if o.Fair {
		return direct, nil
	}
	return direct, declareQueue(conn, queueDecl{name: membersQueueName(queue), args: amqp.Table{argQueueType: string(Classic)}})
}

func bindShard(conn *amqp.Connection, queue, exchange string) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("consumer: open channel to bind %q: %w", queue, err)
	}
	defer func() { _ = ch.Close() }()
	// The binding key of a consistent-hash exchange is the shard's weight.
	if err := ch.QueueBind(queue, "1", exchange, false, nil); err != nil {
		return fmt.Errorf("consumer: bind %q to %q: %w", queue, exchange, err)
	}
	return nil
}
