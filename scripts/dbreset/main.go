// Command dbreset drops and recreates the test database named in
// TEST_DATABASE_URL (default inboxmq_test), for `make db/reset`. The tests
// recreate it on first use, with migrations applied per test schema.
package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
)

func main() {
	if err := reset(); err != nil {
		fmt.Fprintln(os.Stderr, "dbreset:", err)
		os.Exit(1)
	}
}

func reset() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgx.ParseConfig(cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/inboxmq_test?sslmode=disable"))
	if err != nil {
		return err
	}
	name := cfg.Database
	if name == "" || name == "postgres" {
		return fmt.Errorf("refusing to drop database %q", name)
	}
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	id := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+id+" WITH (FORCE)"); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+id); err != nil {
		return err
	}
	fmt.Println("dbreset: recreated", name)
	return nil
}
