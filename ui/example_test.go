package ui_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
	"github.com/inboxmq/inboxmq/ui"
)

// A worker mounts the console on its own listener, under /console.
func ExampleNew() {
	ctx := context.Background()
	// A schema of this example's own with the inboxmq tables.
	schema := "ex_" + strings.ToLower(rand.Text()[:12])
	admin, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	defer admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}

	con, err := ui.New(&ui.Config{
		DB:       pool,
		AMQPURL:  testenv.AMQPURL(),
		Queues:   []ui.Queue{{Name: "payments"}},
		Token:    "a-long-random-operator-token", // INBOXCTL_UI_TOKEN
		Logger:   slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		BasePath: "/console",
	})
	if err != nil {
		panic(err)
	}
	defer con.Close()
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", con))

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/console/", nil))
	fmt.Println(rec.Code, strings.Contains(rec.Body.String(), `<tr data-queue="payments">`))
	fmt.Println(rec.Header().Get("X-Frame-Options"))
	// Output:
	// 200 true
	// DENY
}
