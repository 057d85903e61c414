package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/migrations"
)

// exampleEnv gives an example its own PostgreSQL schema (migrated) and
// RabbitMQ queue on the local test services; cleanup drops both.
func exampleEnv(ctx context.Context) (pool *pgxpool.Pool, conn *amqp.Connection, queue string, cleanup func(), err error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	schema, queue := "ex_outbox_"+suffix, "ex.outbox."+suffix

	if err := createDatabase(ctx); err != nil {
		return nil, nil, "", nil, err
	}
	admin, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		return nil, nil, "", nil, err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, nil, "", nil, err
	}
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		return nil, nil, "", nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, nil, "", nil, err
	}
	if conn, err = amqp.Dial(testenv.AMQPURL()); err != nil {
		pool.Close()
		return nil, nil, "", nil, err
	}
	cleanup = func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
		}
		_ = conn.Close()
		pool.Close()
		if c, err := pgx.Connect(context.Background(), testenv.DatabaseURL()); err == nil {
			_, _ = c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
			_ = c.Close(context.Background())
		}
	}
	if err := migrations.Up(ctx, pool); err != nil {
		cleanup()
		return nil, nil, "", nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-expires": int32(600000)})
		_ = ch.Close()
	}
	if err != nil {
		cleanup()
		return nil, nil, "", nil, err
	}
	return pool, conn, queue, cleanup, nil
}

// createDatabase creates the test database if it does not exist yet.
func createDatabase(ctx context.Context) error {
	cfg, err := pgx.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		return err
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return c.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" {
		return err
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	a, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return err
	}
	defer a.Close(ctx)
	_, err = a.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{cfg.Database}.Sanitize())
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // created meanwhile
		return nil
	}
	return err
}
