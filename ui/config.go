package ui

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqpdial"
	"github.com/inboxmq/inboxmq/internal/consumer"
)

// Queue is one work queue the console shows, with its inbox namespace and
// the broker queues around it.
type Queue struct {
	// Name is the work queue. Required.
	Name string
	// Namespace is the inbox namespace of its handler (the route's
	// namespace, which the controls name too). Defaults to Name.
	Namespace string
	// DeadLetterQueue is its DLQ. Defaults to "<Name>.dlq".
	DeadLetterQueue string
	// RetryTiers are its broker delay tiers, whose depths the overview
	// shows. Defaults to the worker's default tiers (inboxmq.QueueOpts:
	// 1s, 5s, 30s, 2m and 10m).
	RetryTiers []time.Duration
}

// Config configures a [Console]. DB and Token are required.
type Config struct {
	// DB is a pool on the PostgreSQL primary holding the inbox and the
	// controls. Required. The console never closes it.
	DB *pgxpool.Pool
	// AMQPURL is the broker's URL (or a cluster's node URLs separated by
	// commas: the console connects to one that answers), for the queue
	// depths, the dead letters and the parked queues. Defaults to "": the broker's parts of the
	// console say it has no broker. Its password is never shown.
	AMQPURL string
	// Queues are the work queues shown. Defaults to nil: every namespace
	// found in the inbox (at most 100), each taken as a queue of the same
	// name with the default DLQ and retry tiers.
	Queues []Queue
	// Token is the operator token every change needs: an operator signs in
	// with it once per browser session. Required, at least 16 bytes.
	Token string
	// Logger receives one audit line per action (who, what, which keys,
	// result) and per refused request. Defaults to nil: no logging.
	Logger *slog.Logger
	// Registerer registers inboxmq_ui_actions_total{action,result}.
	// Defaults to nil: the counter is kept but not registered.
	Registerer prometheus.Registerer
	// Inbox configures the inbox store the console reads (its Table).
	// Defaults to nil: the store's defaults.
	Inbox *inbox.StoreConfig
	// Reconciler configures the reconcile pass the console runs (Grace,
	// BatchSize, MaxAttempts, EffectChecks). Defaults to nil: the
	// reconciler's defaults.
	Reconciler *inbox.ReconcilerConfig
	// BasePath is the path the console is mounted under, such as
	// "/console" (strip it before the console with http.StripPrefix).
	// Defaults to "": the root.
	BasePath string
	// QueryTimeout bounds each database statement of a page. Defaults to
	// 3s.
	QueryTimeout time.Duration
	// PageSize is the most rows a list shows at once. Defaults to 50.
	PageSize int
	// PeekLimit is the most dead letters (or parked messages) read for one
	// page. Defaults to 200.
	PeekLimit int
	// BodyLimit is the most bytes of a message body or stored payload
	// shown. Defaults to 16 KiB.
	BodyLimit int
	// Refresh is the overview's reload period. Defaults to 10s; -1 turns it
	// off.
	Refresh time.Duration
	// SessionTTL is how long a sign-in lasts. Defaults to 12h.
	SessionTTL time.Duration
}

func (c *Config) withDefaults() (Config, error) {
	if c == nil {
		return Config{}, errors.New("ui: nil Config")
	}
	o := *c
	if o.DB == nil {
		return o, errors.New("ui: Config.DB is required")
	}
	if len(o.Token) < 16 {
		return o, errors.New("ui: Config.Token must be at least 16 bytes")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.BasePath = strings.TrimRight(o.BasePath, "/")
	if o.BasePath != "" && !strings.HasPrefix(o.BasePath, "/") {
		return o, fmt.Errorf("ui: BasePath %q must start with /", o.BasePath)
	}
	if o.QueryTimeout <= 0 {
		o.QueryTimeout = 3 * time.Second
	}
	if o.PageSize <= 0 {
		o.PageSize = 50
	}
	if o.PeekLimit <= 0 {
		o.PeekLimit = 200
	}
	if o.BodyLimit <= 0 {
		o.BodyLimit = 16 << 10
	}
	if o.Refresh == 0 {
		o.Refresh = 10 * time.Second
	}
	if o.SessionTTL <= 0 {
		o.SessionTTL = 12 * time.Hour
	}
	if o.AMQPURL != "" {
		if _, err := amqpdial.Parse(o.AMQPURL); err != nil {
			return o, fmt.Errorf("ui: AMQPURL: %w", err)
		}
	}
	qs := make([]Queue, 0, len(o.Queues))
	for _, q := range o.Queues {
		q, err := q.withDefaults()
		if err != nil {
			return o, err
		}
		qs = append(qs, q)
	}
	o.Queues = qs
	return o, nil
}

func (q Queue) withDefaults() (Queue, error) {
	if !consumer.ValidName(q.Name) {
		return q, fmt.Errorf("ui: invalid queue name %q", q.Name)
	}
	if q.Namespace == "" {
		q.Namespace = q.Name
	}
	if q.DeadLetterQueue == "" {
		q.DeadLetterQueue = inboxtype.DeadLetterQueue(q.Name)
	}
	if !consumer.ValidName(q.DeadLetterQueue) {
		return q, fmt.Errorf("ui: invalid dead-letter queue name %q", q.DeadLetterQueue)
	}
	if q.RetryTiers == nil {
		q.RetryTiers = consumer.DefaultRetryTiers
	}
	q.RetryTiers = slices.Sorted(slices.Values(q.RetryTiers))
	return q, nil
}
