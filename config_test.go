package inboxmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
)

// order is a keyed payload; unkeyed is not.
type order struct {
	ID string `json:"id"`
}

func (o order) IdempotencyKey() string { return "order:" + o.ID }

type unkeyed struct {
	ID string `json:"id"`
}

func noop[T any](context.Context, pgx.Tx, *inboxtype.Message[T]) error { return nil }

// NewWorker refuses a bad Config, each error saying what is wrong, and
// does no I/O (the pool and the Redis client point at nothing).
func TestNewWorker_Validation(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })

	routes := func(add ...func(*inboxmq.Routes)) *inboxmq.Routes {
		r := inboxmq.NewRoutes()
		if len(add) == 0 {
			inboxmq.HandleTx(r, "orders", noop[order], nil)
		}
		for _, a := range add {
			a(r)
		}
		return r
	}
	valid := func() *inboxmq.Config {
		return &inboxmq.Config{URL: "amqp://guest:guest@127.0.0.1:5672/", DB: pool, Routes: routes()}
	}
	tests := []struct {
		name   string
		change func(*inboxmq.Config)
		want   string // "" = valid
	}{
		{"valid", func(*inboxmq.Config) {}, ""},
		{"every field", func(c *inboxmq.Config) {
			c.Redis = rdb
			c.Exchanges = []string{"events"}
			c.Addr = "127.0.0.1:0"
			c.HandlerTimeout = -1
			c.RetentionWindow = 30 * 24 * time.Hour
			c.ReconcileInterval = time.Second
			c.DropUnroutable = true
		}, ""},
		{"every service off", func(c *inboxmq.Config) {
			c.DisableControls, c.DisableRelay = true, true
			c.RetentionWindow, c.ReconcileInterval = -1, -1
		}, ""},
		{"no URL", func(c *inboxmq.Config) { c.URL = "" }, "Config.URL is required"},
		{"not an AMQP URL", func(c *inboxmq.Config) { c.URL = "http://x:s3cret@host/" }, "want an amqp:// or amqps:// URL"},
		{"no DB", func(c *inboxmq.Config) { c.DB = nil }, "Config.DB is required"},
		{"no routes: the relay alone", func(c *inboxmq.Config) { c.Routes = nil }, ""},
		{"no routes and no relay", func(c *inboxmq.Config) { c.Routes, c.DisableRelay = nil, true }, "has nothing to run"},
		{"empty routes and no relay", func(c *inboxmq.Config) { c.Routes, c.DisableRelay = inboxmq.NewRoutes(), true }, "has nothing to run"},
		{"negative ConnectTimeout", func(c *inboxmq.Config) { c.ConnectTimeout = -time.Second }, "Config.ConnectTimeout -1s"},
		{"negative StopTimeout", func(c *inboxmq.Config) { c.StopTimeout = -1 }, "Config.StopTimeout"},
		{"negative RetentionWindow", func(c *inboxmq.Config) { c.RetentionWindow = -time.Second }, "Config.RetentionWindow -1s: want a positive duration, or -1"},
		{"exchange without name", func(c *inboxmq.Config) { c.Exchanges = []string{""} }, `invalid exchange name ""`},
		{"retention window under the horizon", func(c *inboxmq.Config) {
			c.RetentionWindow = time.Hour
		}, "Config.RetentionWindow: inbox: retention window shorter than the redelivery horizon"},
		{"nil handler", func(c *inboxmq.Config) {
			c.Routes = routes(func(r *inboxmq.Routes) { inboxmq.HandleTx[order](r, "orders", nil, nil) })
		}, `route "orders": nil handler`},
		{"unkeyed payload", func(c *inboxmq.Config) {
			c.Routes = routes(func(r *inboxmq.Routes) { inboxmq.HandleTx(r, "plain", noop[unkeyed], nil) })
		}, `route "plain": payload inboxmq_test.unkeyed does not implement inboxtype.Keyer`},
		{"unkeyed payload with a cache", func(c *inboxmq.Config) {
			c.Redis = rdb
			c.Routes = routes(func(r *inboxmq.Routes) { inboxmq.HandleTx(r, "plain", noop[unkeyed], nil) })
		}, "the inbox needs its idempotency key"},
		{"unkeyed payload in claim mode", func(c *inboxmq.Config) {
			c.Routes = routes(func(r *inboxmq.Routes) {
				inboxmq.HandleClaim(r, "plain", func(context.Context, *inbox.Claim, *inboxtype.Message[unkeyed]) error { return nil }, nil)
			})
		}, "does not implement inboxtype.Keyer"},
		{"two routes on one queue", func(c *inboxmq.Config) {
			c.Routes = routes(func(r *inboxmq.Routes) {
				inboxmq.HandleTx(r, "orders", noop[order], nil)
				inboxmq.HandleTx(r, "orders", noop[order], nil)
			})
		}, `queue "orders" already has a handler`},
		{"invalid queue name", func(c *inboxmq.Config) {
			c.Routes = routes(func(r *inboxmq.Routes) { inboxmq.HandleTx(r, "bad queue", noop[order], nil) })
		}, `route "bad queue"`},
		{"unknown reuse policy", func(c *inboxmq.Config) {
			c.Routes = routes(func(r *inboxmq.Routes) {
				inboxmq.HandleTx(r, "orders", noop[order], &inboxmq.RouteOpts{AfterDead: "retry"})
			})
		}, `RouteOpts.AfterDead "retry": want "run", "reject" or "attach"`},
		{"fault events without an exchange", func(c *inboxmq.Config) {
			c.Routes = routes(func(r *inboxmq.Routes) {
				inboxmq.HandleTx(r, "orders", noop[order], &inboxmq.RouteOpts{Faults: &inboxmq.FaultOpts{}})
			})
		}, `route "orders": fault events need an exchange`},
		{"lock TTL out of range", func(c *inboxmq.Config) {
			c.Redis = rdb
			c.Routes = routes(func(r *inboxmq.Routes) {
				inboxmq.HandleTx(r, "orders", noop[order], &inboxmq.RouteOpts{Lock: &inboxmq.LockOpts{TTL: time.Millisecond}})
			})
		}, `route "orders": RouteOpts.Lock.TTL 1ms: want 1s to 10m`},
		{"lock without Redis", func(c *inboxmq.Config) {
			c.Routes = routes(func(r *inboxmq.Routes) {
				inboxmq.HandleTx(r, "orders", noop[order], &inboxmq.RouteOpts{Lock: &inboxmq.LockOpts{}})
			})
		}, `route "orders": RouteOpts.Lock needs Config.Redis`},
		{"claim settings on a transactional route", func(c *inboxmq.Config) {
			c.Routes = routes(func(r *inboxmq.Routes) {
				inboxmq.HandleTx(r, "orders", noop[order], &inboxmq.RouteOpts{Claim: &inbox.ClaimOpts{}})
			})
		}, `route "orders": RouteOpts.Claim is for claim mode`},
		{"a lease shorter than its heartbeat", func(c *inboxmq.Config) {
			c.Routes = routes(func(r *inboxmq.Routes) {
				inboxmq.HandleClaim(r, "orders", func(context.Context, *inbox.Claim, *inboxtype.Message[order]) error { return nil },
					&inboxmq.RouteOpts{Claim: &inbox.ClaimOpts{Lease: time.Second, Heartbeat: 2 * time.Second}})
			})
		}, `route "orders": inbox: Heartbeat 2s must be shorter than Lease 1s`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid()
			tt.change(cfg)
			w, err := inboxmq.NewWorker(cfg)
			if tt.want == "" {
				require.NoError(t, err)
				require.NotNil(t, w)
				require.NoError(t, w.Stop(t.Context()), "Stop without Start")
				return
			}
			require.ErrorContains(t, err, tt.want)
			require.NotContains(t, err.Error(), "s3cret")
			require.Nil(t, w)
		})
	}
	_, err = inboxmq.NewWorker(nil)
	require.ErrorContains(t, err, "nil Config")
}
