package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/consumer"
)

// connectTimeout names CONNECT_TIMEOUT in the error of a service that did
// not answer in time at start-up, so the operator knows what to raise.
func connectTimeout(err error) error {
	var te *inboxmq.StartTimeoutError
	if errors.As(err, &te) {
		return fmt.Errorf("%s at %s did not answer within %s (CONNECT_TIMEOUT): %w", te.Service, te.Addr, te.Timeout, te.Err)
	}
	return err
}

// pingDatabase waits for the pool's database to answer, bounded by
// CONNECT_TIMEOUT (the worker's own waits are inboxmq.Worker.Start's).
func pingDatabase(ctx context.Context, pool *pgxpool.Pool, cfg config) error {
	deadline := time.Now().Add(cfg.ConnectTimeout)
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := pool.Ping(pctx)
	switch {
	case err == nil:
		return nil
	case ctx.Err() == nil && !time.Now().Before(deadline):
		return connectTimeout(&inboxmq.StartTimeoutError{
			Service: "PostgreSQL", Addr: consumer.RedactURL(cfg.DatabaseURL), Timeout: cfg.ConnectTimeout, Err: err,
		})
	default:
		return fmt.Errorf("PostgreSQL at %s: %w", consumer.RedactURL(cfg.DatabaseURL), err)
	}
}
