// Package consumer runs inboxmq's RabbitMQ workers: a [Router] maps queues
// to typed handlers, and a [Consumer] consumes them and settles every
// delivery so that nothing is acked before its effect is durable.
//
// # Registering handlers
//
// Handlers are typed; registration is a free function because methods
// cannot be generic. The payload is decoded (JSON by default) and
// validated before the handler runs; a payload that cannot be decoded
// (with JSON: also a body that is not valid UTF-8), fails Validate or has
// an idempotency key that [inboxtype.ValidKey] refuses is dead-lettered at once.
// Each decoded delivery carries its Key and its Fingerprint
// ([inboxtype.Fingerprinter]), which the inbox and the completed-cache compare to
// tell a copy of a job from another job reusing its key.
//
//	r := consumer.NewRouter()
//	consumer.Register(r, "payments", inboxtype.HandlerFunc[Payment](handle), &consumer.HandlerOpts{
//		Queue: consumer.QueueOpts{Type: consumer.Quorum, Concurrency: 16},
//	})
//	c, err := consumer.New(&consumer.Config{URL: url, Router: r, Logger: log})
//	if err != nil { … }
//	if err := c.Start(ctx); err != nil { … }
//	defer c.Stop(context.Background())
//
// The types a handler and middleware see (the delivery, the typed message,
// statuses, outcomes, observers, header names, the handler and middleware
// signatures) live in package inboxtype, which the inbox, the outbox,
// metrics and middleware share without importing this runtime.
// HandlerOpts.Namespace is the handler's inbox namespace (idempotency keys
// are unique per namespace); it defaults to the queue name.
//
// # Settlement
//
// A handler only returns an error; package retry classifies it and the
// consumer is the only code that talks to the channel about a delivery:
//
//	nil, duplicate  -> ack
//	retryable       -> copy to the delay tier <queue>.retry.<tier> (publisher confirm), then ack
//	retries spent   -> copy to <queue>.dlq with x-error "exhausted: …" (confirm), then ack
//	permanent       -> copy to <queue>.dlq with x-error "<reason>: …" (confirm), then ack
//	stopped         -> nack with requeue; the attempt is not counted
//
// Acks are coalesced per channel: deliveries that finish together (a group
// commit's batch) and form a run at the head of the channel's unsettled
// delivery tags are acked with one basic.ack multiple=true. The channel's
// acker tracks every tag it hands out, sends nacks before any multiple ack
// that could cover them, and acks singly whatever is not in such a run, so
// a multiple ack never settles a delivery that is still running.
//
// A copy that the broker does not confirm leaves the original requeued,
// never acked. A delivery whose settlement failed (a copy not confirmed,
// an ack lost with its channel) comes back, requeued or redelivered on the
// next connection, and waits longer each time before its handler runs
// again: a settlement that keeps failing never becomes a hot loop. A copy
// whose headers would not fit in one frame of the connection is trimmed
// (the original headers go first, largest first) and its x-error says so;
// it is still retried or dead-lettered. Copies carry no header of the
// consumer's own beyond the failure headers.
//
// Short blips are first retried in process (HandlerOpts.InProcess); each
// try starts from scratch. A panic in a handler becomes an error with
// reason "panic" and the worker lives on.
//
// # Topology
//
// Unless QueueOpts.NoDeclare is set, Start declares per route a durable
// work queue (classic or quorum), its DLQ "<queue>.dlq", its dead queue
// "<queue>.dead" and one wait queue per delay tier ([inboxtype.RetryQueue])
// whose messages expire back into the work queue, so a short delay never
// waits behind a long one. Every work queue dead-letters into its dead
// queue: a message that expires there (a per-message expiration set by
// its producer, or a TTL in QueueOpts.Arguments), is rejected or is
// pushed out by a length limit lands there with the broker's x-death
// reason, never dropped, and the consumer files it into the DLQ as it
// files a handler's permanent failure: with reason "broker_" and the
// x-death reason (broker_expired, broker_delivery_limit, …), its key, and
// HandlerOpts.OnDeadLetter; no handler runs. A quorum queue also gets a
// delivery limit and at-least-once dead-lettering with reject-publish
// overflow: a crash loop ends in the DLQ. A queue that
// exists with other arguments is a start-up error naming the queue and the
// argument, with two exceptions. A route whose queues exist with the other
// queue type (classic for a Quorum route, or the reverse) keeps them with
// their type and Start logs a warning naming the migration: the broker
// cannot change a queue's type. A classic work queue declared before
// v0.1.0, which lacks only the dead-letter route, is kept as it is and
// Start logs a warning naming the policy that gives it the route (see
// docs/operations.md); until then a message that expires there is dropped.
//
// # Connections and shutdown
//
// One supervisor goroutine owns the connection. When the connection or a
// channel closes, or the broker cancels a consumer, it reconnects with
// exponential backoff and jitter, re-declares the topology and resumes
// consuming. Workers of the old connection settle on the old channel, where
// a late ack simply fails and the broker redelivers.
//
// Config.URL may list a cluster's nodes, separated by commas. Each
// connection goes to one node that answers (the next node is tried when
// one does not, each within Config.DialTimeout); a process starts at a
// random node so that many workers spread over the cluster, and a
// connection re-established after a loss starts at the node after the one
// it was on. Every connect and failover is logged with the node, and
// reported to Config.OnBrokerNode. [Dial] connects the same way for a
// program's own publishing.
//
// [Consumer.Stop] cancels the broker consumers, lets in-flight handlers
// finish within Config.SoftStopTimeout, then cancels their contexts with
// cause [ErrStopped] (those deliveries are requeued), and closes the
// connection: whatever was not settled is redelivered. [Consumer.Ready]
// serves a /readyz endpoint.
//
// # Runtime controls
//
// [Consumer.Pause] and [Consumer.Resume] stop and restart taking deliveries
// from one queue (a paused queue stays paused across reconnects), and
// [Consumer.SetConcurrency] lowers how many of its handlers run at once.
//
// # Ordered routes
//
// With [HandlerOpts].Ordered ([OrderedOpts]) a route applies the messages
// of one ordering key one at a time, in the order the broker received
// them, across all its workers, while different keys run in parallel.
// Producers publish to the route's consistent-hash exchange with the key
// (an aggregate's id) as routing key; each of the route's shard queues is
// consumed by one worker at a time, and workers that join or leave share
// the shards out by themselves. A failing message is retried in process
// and holds its key's later messages back until it succeeds or is
// dead-lettered.
//
// # Dead letters
//
// [ReplayDLQ] moves selected dead letters (by reason, key or count) back to
// the work queue with their body unchanged, so the inbox recognises them;
// MaxReplays bounds how often one message comes back.
package consumer
