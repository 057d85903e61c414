package controlrun_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/internal/controlrun"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
)

// exampleDB opens a pool on a fresh, migrated schema of the test database
// and returns a function that drops it.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	schema := "ex_" + strings.ToLower(rand.Text()[:12])
	admin, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	if err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		_ = admin.Close(context.Background())
	}
}

// printTarget stands in for *consumer.Consumer.
type printTarget struct{}

func (printTarget) Pause(q string) error  { fmt.Println("pause", q); return nil }
func (printTarget) Resume(q string) error { fmt.Println("resume", q); return nil }
func (printTarget) SetConcurrency(q string, n int) error {
	fmt.Println("concurrency", q, n)
	return nil
}

// A worker runs a Watcher next to its consumer; an operator (inboxctl)
// writes through a Store.
func Example_pause() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()

	w, err := controlrun.NewWatcher(pool, &controlrun.WatcherConfig{
		Target: printTarget{},                             // a *consumer.Consumer in a worker
		Queues: map[string]string{"payments": "payments"}, // controlrun.QueuesOf(router)
	})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer w.Stop(ctx)

	ops := control.NewStore(pool)
	_ = ops.Pause(ctx, "payments", &control.ChangeOpts{By: "alice", Reason: "gateway outage"})
	_ = w.Refresh(ctx) // running workers pick the change up by NOTIFY within 2s
	_ = ops.SetConcurrency(ctx, "payments", 2, nil)
	_ = ops.Resume(ctx, "payments", nil)
	_ = w.Refresh(ctx)
	// Output:
	// pause payments
	// concurrency payments 2
	// resume payments
}

// Blocked answers from the watcher's in-memory snapshot.
func ExampleWatcher_Blocked() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()

	ops := control.NewStore(pool)
	_ = ops.Block(ctx, control.Block{Namespace: "payments", Pattern: "tenant:9:", Prefix: true, Reason: "data repair"})

	w, _ := controlrun.NewWatcher(pool, nil)
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer w.Stop(ctx)
	fmt.Println(w.Blocked("payments", "tenant:9:order:1"))
	fmt.Println(w.Blocked("payments", "tenant:1:order:1"))
	fmt.Println(w.Blocked("emails", "tenant:9:order:1"))
	// Output:
	// true
	// false
	// false
}
