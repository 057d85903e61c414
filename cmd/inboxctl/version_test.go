package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq"
)

func TestVersionCommand(t *testing.T) {
	t.Parallel()
	b := &cliBundle{env: map[string]string{}} // needs no database and no broker

	r := b.run(t, "version")
	require.Equal(t, exitOK, r.code, r.errOut)
	first, _, _ := strings.Cut(r.out, "\n")
	require.Equal(t, "inboxctl "+inboxmq.Version, first)
	require.Contains(t, r.out, "\ngo       "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH+"\n")

	var v versionInfo
	r = b.run(t, "version", "-o", "json")
	require.Equal(t, exitOK, r.code, r.errOut)
	r.json(t, &v)
	require.Equal(t, inboxmq.Version, v.Version)
	require.Equal(t, runtime.Version(), v.Go)
	require.Equal(t, runtime.GOOS+"/"+runtime.GOARCH, v.Platform)

	r = b.run(t, "version", "extra")
	require.Equal(t, exitUsage, r.code)
}

func TestVersionOf(t *testing.T) {
	t.Parallel()
	platform := runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want versionInfo
		text string
	}{
		{
			name: "no build info",
			want: versionInfo{Version: inboxmq.Version, Go: runtime.Version(), Platform: platform},
			text: "inboxctl " + inboxmq.Version + "\n" +
				"go       " + runtime.Version() + " " + platform + "\n",
		},
		{
			name: "go install at a tag",
			bi: &debug.BuildInfo{
				GoVersion: "go1.26.1",
				Main:      debug.Module{Path: "github.com/inboxmq/inboxmq", Version: "v0.1.0"},
			},
			want: versionInfo{
				Version: inboxmq.Version, Module: "github.com/inboxmq/inboxmq", ModuleVersion: "v0.1.0",
				Go: "go1.26.1", Platform: platform,
			},
			text: "inboxctl " + inboxmq.Version + "\n" +
				"module   github.com/inboxmq/inboxmq v0.1.0\n" +
				"go       go1.26.1 " + platform + "\n",
		},
		{
			name: "built from a modified checkout",
			bi: &debug.BuildInfo{
				GoVersion: "go1.26.8",
				Main:      debug.Module{Path: "github.com/inboxmq/inboxmq", Version: "(devel)"},
				Settings: []debug.BuildSetting{
					{Key: "-race", Value: "true"},
					{Key: "vcs", Value: "git"},
					{Key: "vcs.revision", Value: "c68a8e6d0123456789abcdef0123456789abcdef"},
					{Key: "vcs.time", Value: "2026-12-02T10:00:00Z"},
					{Key: "vcs.modified", Value: "true"},
				},
			},
			want: versionInfo{
				Version: inboxmq.Version, Module: "github.com/inboxmq/inboxmq", ModuleVersion: "(devel)",
				Revision: "c68a8e6d0123456789abcdef0123456789abcdef", RevisionTime: "2026-12-02T10:00:00Z",
				Modified: true, Go: "go1.26.8", Platform: platform,
			},
			text: "inboxctl " + inboxmq.Version + "\n" +
				"module   github.com/inboxmq/inboxmq (devel)\n" +
				"revision c68a8e6d0123456789abcdef0123456789abcdef 2026-12-02T10:00:00Z (modified)\n" +
				"go       go1.26.8 " + platform + "\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := versionOf(tc.bi)
			require.Equal(t, tc.want, v)
			require.Equal(t, tc.text, v.text())
		})
	}
}
