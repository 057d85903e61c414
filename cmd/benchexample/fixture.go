package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
)

// bench holds what every drain shares: the services, the worker binary
// and the settings.
type bench struct {
	amqpURL, dbURL, redisURL string
	bin, dir                 string // the worker binary; the directory of it and the logs
	n                        int
	timeout                  time.Duration
	admin                    *pgx.Conn // schemas: created and dropped
	conn                     *amqp.Connection
	redis                    *redis.Client
}

// fixture is one drain's world: a fresh schema with the worker's tables, a
// fresh queue declared by the worker itself, its events exchange, and the
// order ids of its payments.
type fixture struct {
	b       *bench
	schema  string
	queue   string
	events  string
	orders  string // order id prefix
	dbURL   string // b.dbURL on schema
	db      *pgx.Conn
	logPath string
	env     []string // the worker's environment for this drain
	startup time.Duration
}

// newFixture builds the world of run's drain of v: a schema the worker's
// `migrate` fills, then a first `run` of the worker (with v's settings)
// that declares the queue and its topology as a deployed worker finds
// them, stopped once ready. Its time to ready is the fixture's startup.
func (b *bench) newFixture(ctx context.Context, v variant, run int) (*fixture, error) {
	id := fmt.Sprintf("%d_%d_%s", os.Getpid(), run, v.id)
	f := &fixture{
		b:       b,
		schema:  "benchexample_" + id,
		queue:   "benchexample." + strings.ReplaceAll(id, "_", "."),
		orders:  "bx-" + strings.ReplaceAll(id, "_", "-"),
		logPath: filepath.Join(b.dir, "worker-"+id+".log"),
	}
	f.events = f.queue + ".events"
	f.dbURL = withSearchPath(b.dbURL, f.schema)
	f.env = workerEnv(append([]string{
		"AMQP_URL=" + b.amqpURL, "DATABASE_URL=" + f.dbURL, "REDIS_URL=" + b.redisURL,
		"PAYMENT_QUEUE=" + f.queue, "PAYMENT_EVENTS_EXCHANGE=" + f.events,
	}, v.env...)...)
	if err := f.setup(ctx); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

func (f *fixture) setup(ctx context.Context) error {
	if _, err := f.b.admin.Exec(ctx, "CREATE SCHEMA "+f.schema); err != nil {
		return err
	}
	migrate := exec.CommandContext(ctx, f.b.bin, "migrate")
	migrate.Env = f.env
	if out, err := migrate.CombinedOutput(); err != nil {
		return fmt.Errorf("payment-worker migrate: %w\n%s", err, out)
	}
	start := time.Now()
	p, err := startWorker(f.b.bin, f.logPath, f.env)
	if err != nil {
		return err
	}
	err = p.waitReady(ctx, time.Minute)
	f.startup = time.Since(start)
	if err = errors.Join(err, p.stop()); err != nil {
		return fmt.Errorf("declaring start: %w", err)
	}
	f.db, err = pgx.Connect(ctx, f.dbURL)
	return err
}

// payment is the payment-worker's Payment, as it decodes it.
type payment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// publish queues b.n persistent payments (unique order ids and message
// ids) with publisher confirms, then checks the queue holds them all.
func (f *fixture) publish(ctx context.Context) error {
	ch, err := f.b.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, f.b.n+1))
	for i := range f.b.n {
		body, err := json.Marshal(payment{OrderID: fmt.Sprintf("%s-%06d", f.orders, i), AmountCents: 100 + int64(i%1000), Currency: "EUR"})
		if err != nil {
			return err
		}
		if err := ch.PublishWithContext(ctx, "", f.queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json",
			MessageId: fmt.Sprintf("%s-m%06d", f.orders, i), Body: body,
		}); err != nil {
			return err
		}
	}
	for range f.b.n {
		select {
		case c := <-confirms:
			if !c.Ack {
				return fmt.Errorf("publish %d nacked", c.DeliveryTag)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if depth, err := f.depth(f.queue); err != nil || depth != f.b.n {
		return errors.Join(fmt.Errorf("queue %s holds %d messages, want %d", f.queue, depth, f.b.n), err)
	}
	return nil
}

// depth is the number of ready messages in queue.
func (f *fixture) depth(queue string) (int, error) {
	ch, err := f.b.conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return q.Messages, err
}

// waitDone polls every 10 ms until the schema holds b.n payments rows and,
// with outbox, no outbox row is pending (the worker's relay sent every
// event). It fails early if died is closed (the consumer ended).
func (f *fixture) waitDone(ctx context.Context, outbox bool, died <-chan struct{}) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(f.b.timeout)
	defer deadline.Stop()
	var rows int
	for {
		select {
		case <-tick.C:
		case <-died:
			return fmt.Errorf("the consumer ended at %d of %d payments", rows, f.b.n)
		case <-deadline.C:
			return fmt.Errorf("%d of %d payments after %s", rows, f.b.n, f.b.timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
		if rows < f.b.n {
			if err := f.db.QueryRow(ctx, "SELECT count(*) FROM payments").Scan(&rows); err != nil {
				return err
			}
			if rows < f.b.n {
				continue
			}
		}
		if !outbox {
			return nil
		}
		var pending bool
		if err := f.db.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM inboxmq_outbox WHERE sent_at IS NULL)").Scan(&pending); err != nil {
			return err
		}
		if !pending {
			return nil
		}
	}
}

// check requires, after the consumer stopped, one payment, ledger entry,
// completed inbox row and outbox row per message, every outbox row sent
// when sent, and the queue and its DLQ empty.
func (f *fixture) check(ctx context.Context, sent bool) error {
	var payments, ledger, inbox, events, pending int
	if err := f.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM ledger_entries),
	(SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'), (SELECT count(*) FROM inboxmq_outbox),
	(SELECT count(*) FROM inboxmq_outbox WHERE sent_at IS NULL)`).Scan(&payments, &ledger, &inbox, &events, &pending); err != nil {
		return err
	}
	n := f.b.n
	if payments != n || ledger != n || inbox != n || events != n || sent && pending != 0 {
		return fmt.Errorf("%d payments, %d ledger entries, %d completed inbox rows, %d outbox rows (%d pending) for %d messages",
			payments, ledger, inbox, events, pending, n)
	}
	for _, q := range []string{f.queue, inboxtype.DeadLetterQueue(f.queue)} {
		if depth, err := f.depth(q); err != nil || depth != 0 {
			return errors.Join(fmt.Errorf("queue %s holds %d messages after the drain", q, depth), err)
		}
	}
	return nil
}

// close drops the schema, deletes the queues the worker declared, its
// events exchange and the Redis keys of the drain (the completed-cache),
// with a context of its own: it also runs after an interrupt.
func (f *fixture) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if f.db != nil {
		_ = f.db.Close(ctx)
	}
	if _, err := f.b.admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+f.schema+" CASCADE"); err != nil {
		fmt.Fprintf(os.Stderr, "benchexample: drop schema %s: %v\n", f.schema, err)
	}
	names := []string{f.queue, inboxtype.DeadLetterQueue(f.queue), f.queue + ".dead", inboxtype.ParkedQueue(f.queue)}
	for _, tier := range consumer.DefaultRetryTiers {
		names = append(names, inboxtype.RetryQueue(f.queue, tier))
	}
	for _, name := range names {
		if ch, err := f.b.conn.Channel(); err == nil { // a failed delete closes its channel
			_, _ = ch.QueueDelete(name, false, false, false)
			_ = ch.Close()
		}
	}
	if ch, err := f.b.conn.Channel(); err == nil {
		_ = ch.ExchangeDelete(f.events, false, false)
		_ = ch.Close()
	}
	// The worker's keys name its queue ("inboxmq:done:<queue>:<key>").
	iter := f.b.redis.Scan(ctx, 0, "*"+f.queue+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	for len(keys) > 0 {
		batch := keys[:min(len(keys), 1000)]
		keys = keys[len(batch):]
		_ = f.b.redis.Unlink(ctx, batch...).Err()
	}
}

// withSearchPath returns the PostgreSQL URL u with search_path=schema.
func withSearchPath(u, schema string) string {
	if strings.Contains(u, "?") {
		return u + "&search_path=" + schema
	}
	return u + "?search_path=" + schema
}
