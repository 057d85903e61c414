package chaos_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/chaos"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// TestChaosCI is the CI-sized chaos run: both scenarios, three worker
// processes, every fault but the Redis restart, a fixed seed. It builds the
// payment-worker binary, so it takes about a minute; `make chaos` (cmd/
// inboxchaos) is the full-size run.
func TestChaosCI(t *testing.T) {
	t.Parallel()
	chaosCI(t, 20261129, false)
}

// TestChaosCI_GroupCommit is the same run with GROUP_COMMIT=on: crashes,
// stalls and lost connections hit batches of deliveries sharing one
// transaction, and of claim-mode completions sharing one. Its workers take
// the Redis lock (LOCK=on), which TestChaosCI's leave at the default (no
// lock), so that stalls and lost connections also hit held locks.
func TestChaosCI_GroupCommit(t *testing.T) {
	t.Parallel()
	chaosCI(t, 20261202, true)
}

func chaosCI(t *testing.T, seed uint64, group bool) {
	lock := ""
	if group {
		lock = "on"
	}
	pgtest.Schema(t) // creates the test database if it is missing
	var log bytes.Buffer
	rep, err := chaos.Run(t.Context(), &chaos.Config{
		Seed:         seed,
		Orders:       120,
		Workers:      3,
		Duration:     15 * time.Second,
		FaultEvery:   1500 * time.Millisecond,
		DrainTimeout: 90 * time.Second,
		GroupCommit:  group,
		Lock:         lock,
		WorkDir:      t.TempDir(),
		AMQPURL:      testenv.AMQPURL(),
		DatabaseURL:  testenv.DatabaseURL(),
		RedisURL:     testenv.RedisURL(),
		Log:          &log,
	})
	var table bytes.Buffer
	if rep != nil {
		rep.WriteTable(&table)
	}
	t.Log("\n" + log.String() + table.String())
	require.NoError(t, err)
	require.True(t, rep.OK(), "guarantees broken:\n%s", table.String())
	require.Len(t, rep.Scenarios, 2)

	kinds := map[string]bool{}
	for _, s := range rep.Scenarios {
		require.Equal(t, 120, s.Orders)
		require.Greater(t, s.Publishes, s.Orders+s.Poison, "orders are published more than once")
		require.NotEmpty(t, s.Faults)
		require.NotNil(t, s.Check)
		require.Equal(t, 120, s.Check.Payments)
		require.Equal(t, 120, s.Check.LedgerEntries)
		for _, f := range s.Faults {
			require.Empty(t, f.Err, "fault %s at %s", f.Kind, f.At)
			kinds[f.Kind] = true
		}
	}
	require.GreaterOrEqual(t, len(kinds), 4, "the schedule exercised several kinds of fault: %v", kinds)
	// Every worker ran in the commit mode asked for.
	for _, s := range rep.Scenarios {
		logs, err := filepath.Glob(filepath.Join(s.LogDir, "worker-*.log"))
		require.NoError(t, err)
		require.Len(t, logs, 3)
		for _, l := range logs {
			b, err := os.ReadFile(l)
			require.NoError(t, err)
			require.Contains(t, string(b), fmt.Sprintf(`"group_commit":%v`, group), l)
		}
	}
	// The workers took the lock exactly when asked to.
	for _, s := range rep.Scenarios {
		if lock == "on" {
			require.Positive(t, s.Metrics["lock_acquire_success_total"], "LOCK=on: deliveries took the lock (%s)", s.Name)
		} else {
			require.Zero(t, s.Metrics["lock_acquire_success_total"], "the default takes no lock (%s)", s.Name)
		}
	}
	gw := rep.Scenarios[1]
	require.Equal(t, chaos.ScenarioGateway, gw.Name)
	require.Equal(t, 120, gw.Check.ChargesCreated)
}

// TestChaosCI_Recovery is the Recovery issue's schedule: workers killed
// and a PostgreSQL server of the run's own restarted (every session ends)
// while claims are in flight, with a slow gateway. Nothing is lost or done
// twice, and no claim is left to wait out its lease: a release that
// failed while the server was down goes through when it answers.
func TestChaosCI_Recovery(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	rep, err := chaos.Run(t.Context(), &chaos.Config{
		Seed:            20261206,
		Orders:          200,
		Workers:         2,
		Duration:        15 * time.Second,
		FaultEvery:      1500 * time.Millisecond,
		DrainTimeout:    90 * time.Second,
		Faults:          []string{chaos.FaultKill, chaos.FaultPGRestart, chaos.FaultGatewaySlow},
		RestartPostgres: true,
		WorkDir:         t.TempDir(),
		AMQPURL:         testenv.AMQPURL(),
		RedisURL:        testenv.RedisURL(),
		Log:             &log,
	})
	var table bytes.Buffer
	if rep != nil {
		rep.WriteTable(&table)
	}
	t.Log("\n" + log.String() + table.String())
	require.NoError(t, err)
	require.True(t, rep.OK(), "guarantees broken:\n%s", table.String())
	kinds := map[string]int{}
	for _, s := range rep.Scenarios {
		require.NotNil(t, s.Check)
		require.Equal(t, 200, s.Check.Payments)
		require.Equal(t, 200, s.Check.LedgerEntries)
		for _, f := range s.Faults {
			require.Empty(t, f.Err, "fault %s at %s", f.Kind, f.At)
			kinds[f.Kind]++
		}
		logs, err := filepath.Glob(filepath.Join(s.LogDir, "worker-*.log"))
		require.NoError(t, err)
		for _, l := range logs {
			b, err := os.ReadFile(l)
			require.NoError(t, err)
			require.NotContains(t, string(b), "after its lease", l)
		}
	}
	require.Positive(t, kinds[chaos.FaultPGRestart], "the server was restarted: %v", kinds)
	require.Positive(t, kinds[chaos.FaultKill], "a worker was killed: %v", kinds)
}
