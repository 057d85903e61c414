// Package testenv holds the endpoints of the services that inboxmq's
// integration tests use, and the rule for when one is missing: the test
// fails (it never skips), with a message that says how to start it.
//
// Endpoints come from TEST_DATABASE_URL, TEST_AMQP_URL and TEST_REDIS_URL,
// falling back to the local services (make up starts them with docker
// compose; CI starts them on loopback).
package testenv

import (
	"cmp"
	"os"
	"testing"
	"time"
)

// DatabaseURL is the PostgreSQL test database (created on first use).
func DatabaseURL() string {
	return cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/inboxmq_test?sslmode=disable")
}

// AMQPURL is the RabbitMQ broker used by tests.
func AMQPURL() string {
	return cmp.Or(os.Getenv("TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
}

// RedisURL is the Redis server used by tests.
func RedisURL() string {
	return cmp.Or(os.Getenv("TEST_REDIS_URL"), "redis://127.0.0.1:6379/9")
}

// CI reports whether the tests run under CI (CI=true).
func CI() bool { return os.Getenv("CI") == "true" }

// Unavailable fails the test because a service it needs is unreachable. It
// never skips: a missing service is a broken environment, not a pass.
func Unavailable(tb testing.TB, service string, err error) {
	tb.Helper()
	tb.Fatalf("%s is unreachable (%v): start it with `make up` (docker compose) or point TEST_%s_URL at one", service, err, envName(service))
}

func envName(service string) string {
	switch service {
	case "PostgreSQL":
		return "DATABASE"
	case "RabbitMQ":
		return "AMQP"
	default:
		return "REDIS"
	}
}

// Timeout is the bound for waits in tests: longer under CI and -race.
func Timeout() time.Duration {
	if CI() {
		return 60 * time.Second
	}
	return 30 * time.Second
}

// WaitFor polls cond every 10ms until it returns true or Timeout passes, and
// fails the test with msg if it never does. Use it only where no signal
// exists (a row appearing in another process's database, a broker's queue
// depth).
func WaitFor(tb testing.TB, msg string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(Timeout())
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for: %s", Timeout(), msg)
		}
		<-tick.C
	}
}

// WaitChan waits for ch to deliver or close within Timeout, and fails the
// test with msg otherwise.
func WaitChan[T any](tb testing.TB, ch <-chan T, msg string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(Timeout()):
		tb.Fatalf("timed out after %s waiting for: %s", Timeout(), msg)
		var zero T
		return zero
	}
}
