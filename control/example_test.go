package control_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/control"
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

// An operator's tool (inboxctl, the console, a deploy script) changes the
// controls through a Store; every running worker that serves the
// namespace obeys within 2 seconds, and a worker that starts later applies
// them before it takes a delivery.
func ExampleStore() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()

	s := control.NewStore(pool)
	by := &control.ChangeOpts{By: "alice", Reason: "gateway outage"}
	if err := s.Pause(ctx, "payments", by); err != nil {
		panic(err)
	}
	if err := s.SetConcurrency(ctx, "payments", 2, by); err != nil {
		panic(err)
	}
	err := s.Block(ctx, control.Block{Namespace: "payments", Pattern: "tenant:9:", Prefix: true, Reason: "data repair", CreatedBy: "alice"})
	if err != nil {
		panic(err)
	}

	snap, err := s.List(ctx)
	if err != nil {
		panic(err)
	}
	for _, c := range snap.Controls {
		fmt.Printf("%s: paused=%v concurrency=%d by %s (%s)\n", c.Namespace, c.Paused, c.Concurrency, c.UpdatedBy, c.Reason)
	}
	for _, b := range snap.Blocks {
		fmt.Printf("%s: keys starting with %q blocked by %s (%s)\n", b.Namespace, b.Pattern, b.CreatedBy, b.Reason)
	}

	// Undo: resume, restore the configured concurrency (0), unblock.
	if err := s.Resume(ctx, "payments", by); err != nil {
		panic(err)
	}
	if err := s.SetConcurrency(ctx, "payments", 0, by); err != nil {
		panic(err)
	}
	removed, err := s.Unblock(ctx, "payments", "tenant:9:", true)
	if err != nil {
		panic(err)
	}
	fmt.Println("unblocked:", removed)
	// Output:
	// payments: paused=true concurrency=2 by alice (gateway outage)
	// payments: keys starting with "tenant:9:" blocked by alice (data repair)
	// unblocked: true
}

// Blocked reads the database now: a deploy script can check a key before
// it replays messages.
func ExampleStore_Blocked() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()

	s := control.NewStore(pool)
	if err := s.Block(ctx, control.Block{Namespace: "payments", Pattern: "order:7", Reason: "chargeback"}); err != nil {
		panic(err)
	}
	b, ok, err := s.Blocked(ctx, "payments", "order:7")
	if err != nil {
		panic(err)
	}
	fmt.Println(ok, b.Reason)
	_, ok, _ = s.Blocked(ctx, "payments", "order:8")
	fmt.Println(ok)
	// Output:
	// true chargeback
	// false
}
