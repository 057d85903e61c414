//go:build unix

package clustertest_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestScriptRefusesBadInput runs scripts/cluster.sh where no cluster runs:
// bad input is refused with a clear message and nothing is started.
func TestScriptRefusesBadInput(t *testing.T) {
	t.Parallel()
	script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "cluster.sh"))
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "cluster")

	for _, tc := range []struct {
		name string
		env  []string
		args []string
		ok   bool
		want string
	}{
		{name: "env without a cluster", args: []string{"env"}, want: "no cluster in " + dir},
		{name: "status without a cluster", args: []string{"status"}, ok: true, want: "no cluster in " + dir},
		{name: "down without a cluster", args: []string{"down"}, ok: true, want: "no cluster in " + dir},
		{name: "node out of range", args: []string{"kill-rabbit", "4"}, want: "must be 1, 2 or 3, not '4'"},
		{name: "node missing", args: []string{"restart-rabbit"}, want: "must be 1, 2 or 3, not ''"},
		{name: "leader without a queue", args: []string{"rabbit-leader", "/"}, want: "usage: scripts/cluster.sh rabbit-leader VHOST QUEUE"},
		{name: "promote without a cluster", args: []string{"promote-pg"}, want: "no cluster in " + dir},
		{name: "bad port base", env: []string{"CLUSTER_PORT_BASE=5672x"}, args: []string{"up"}, want: "CLUSTER_PORT_BASE must be a number"},
		{name: "port base too high", env: []string{"CLUSTER_PORT_BASE=65500"}, args: []string{"up"}, want: "CLUSTER_PORT_BASE must be a number"},
		{name: "unknown command", args: []string{"upp"}, want: "Usage: scripts/cluster.sh COMMAND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", append([]string{script}, tc.args...)...)
			cmd.Env = append(os.Environ(), "CLUSTER_DIR="+dir, "CLUSTER_PORT_BASE=26990")
			cmd.Env = append(cmd.Env, tc.env...)
			out, err := cmd.CombinedOutput()
			if tc.ok {
				require.NoError(t, err, string(out))
			} else {
				require.Error(t, err, string(out))
			}
			require.Contains(t, string(out), tc.want)
			require.NoDirExists(t, dir, "nothing was started")
		})
	}
}
