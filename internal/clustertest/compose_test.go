//go:build unix

package clustertest_test

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

// TestComposeClusterProfile loads docker-compose.yml as docker compose does
// with --profile cluster, and checks it has the shape of scripts/cluster.sh:
// the services, their host ports and the order they start in. No Docker
// engine is needed.
func TestComposeClusterProfile(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root),
		cli.WithProfiles([]string{"cluster"}),
		cli.WithEnv(nil),
	)
	require.NoError(t, err)
	project, err := opts.LoadProject(t.Context())
	require.NoError(t, err, "docker compose --profile cluster would refuse the file")

	// The service of each host port, as make cluster lays them out.
	want := map[string]string{
		"cluster-rabbit-1":      "25700",
		"cluster-rabbit-2":      "25701",
		"cluster-rabbit-3":      "25702",
		"cluster-pg-primary":    "25710",
		"cluster-pg-standby":    "25711",
		"cluster-redis-primary": "25720",
		"cluster-redis-replica": "25721",
		"cluster-sentinel-1":    "25730",
		"cluster-sentinel-2":    "25731",
		"cluster-sentinel-3":    "25732",
	}
	for name, port := range want {
		svc, err := project.GetService(name)
		require.NoError(t, err, name)
		require.Equal(t, []string{"cluster"}, svc.Profiles, "%s runs only with --profile cluster", name)
		require.Len(t, svc.Ports, 1, name)
		p := svc.Ports[0]
		require.Equal(t, "127.0.0.1", p.HostIP, "%s binds to loopback", name)
		require.Equal(t, port, p.Published, name)
		require.NotNil(t, svc.HealthCheck, "%s has a health check (depends_on waits on it)", name)
		require.Equal(t, "unless-stopped", svc.Restart, "%s restarts like the default stack", name)
	}
	// The default stack is still there and not in the profile.
	for _, name := range []string{"rabbitmq", "postgres", "redis"} {
		svc, err := project.GetService(name)
		require.NoError(t, err, name)
		require.Empty(t, svc.Profiles, name)
	}

	dependsOn := func(svc, on string) {
		t.Helper()
		s, err := project.GetService(svc)
		require.NoError(t, err)
		dep, ok := s.DependsOn[on]
		require.True(t, ok, "%s depends on %s", svc, on)
		require.Equal(t, types.ServiceConditionHealthy, dep.Condition, "%s waits until %s is healthy", svc, on)
	}
	dependsOn("cluster-rabbit-2", "cluster-rabbit-1")
	dependsOn("cluster-rabbit-3", "cluster-rabbit-1")
	dependsOn("cluster-pg-standby", "cluster-pg-primary")
	dependsOn("cluster-redis-replica", "cluster-redis-primary")
	for _, s := range []string{"cluster-sentinel-1", "cluster-sentinel-2", "cluster-sentinel-3"} {
		dependsOn(s, "cluster-redis-primary")
		dependsOn(s, "cluster-redis-replica")
	}

	// The RabbitMQ nodes share a cookie and find each other by config.
	conf := project.Configs["cluster-rabbit-conf"].Content
	for i, name := range []string{"cluster-rabbit-1", "cluster-rabbit-2", "cluster-rabbit-3"} {
		svc, err := project.GetService(name)
		require.NoError(t, err)
		require.Equal(t, name, svc.Hostname, "the node name rabbit@%s needs that hostname", name)
		require.Contains(t, conf, "cluster_formation.classic_config.nodes."+strconv.Itoa(i+1)+" = rabbit@"+name)
		require.Contains(t, *svc.Environment["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"], "-setcookie ")
		require.True(t, slices.ContainsFunc(svc.Configs, func(c types.ServiceConfigObjConfig) bool {
			return c.Source == "cluster-rabbit-conf"
		}), name)
	}
	require.Contains(t, conf, "cluster_partition_handling = pause_minority")
	require.Contains(t, project.Configs["cluster-rabbit-plugins"].Content, "rabbitmq_consistent_hash_exchange")

	// The standby is cloned with pg_basebackup -R; the Sentinels watch mymaster with quorum 2.
	standby, err := project.GetService("cluster-pg-standby")
	require.NoError(t, err)
	require.Contains(t, strings.Join(standby.Command, " "), "pg_basebackup -h cluster-pg-primary -U postgres -D \"$PGDATA\" -R")
	require.Contains(t, project.Configs["cluster-sentinel-conf"].Content, "sentinel monitor mymaster cluster-redis-primary 6379 2")
	require.Contains(t, project.Configs["cluster-pg-replication"].Content, `>>"$PGDATA/pg_hba.conf"`, "$$ is compose's escape for $")
}
