package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq"
)

// versionInfo is what inboxctl version reports. Empty fields were not
// recorded in the binary (a build outside a module, or without VCS
// stamping, as go install at a tag does).
type versionInfo struct {
	Version       string `json:"version"`                  // the inboxmq release (inboxmq.Version)
	Module        string `json:"module,omitempty"`         // the main module's path
	ModuleVersion string `json:"module_version,omitempty"` // its version: a tag, or (devel)
	Revision      string `json:"revision,omitempty"`       // the VCS commit it was built from
	RevisionTime  string `json:"revision_time,omitempty"`  // that commit's time
	Modified      bool   `json:"modified,omitempty"`       // the tree had uncommitted changes
	Go            string `json:"go"`                       // the Go toolchain that built it
	Platform      string `json:"platform"`                 // GOOS/GOARCH
}

func (c *cli) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the inboxmq release and how this binary was built",
		Long: `version prints the inboxmq release, the module version, the VCS revision
(when the binary records one) and the Go toolchain. It needs no database
and no broker.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			bi, _ := debug.ReadBuildInfo()
			v := versionOf(bi)
			return c.emit(v, func(w io.Writer) { _, _ = io.WriteString(w, v.text()) })
		},
	}
}

// versionOf builds the report from the binary's build information; bi may
// be nil.
func versionOf(bi *debug.BuildInfo) versionInfo {
	v := versionInfo{
		Version:  inboxmq.Version,
		Go:       runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi == nil {
		return v
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	v.Module, v.ModuleVersion = bi.Main.Path, bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.RevisionTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// text is the human-readable report, one fact per line.
func (v versionInfo) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "inboxctl %s\n", v.Version)
	if v.Module != "" {
		fmt.Fprintf(&b, "module   %s %s\n", v.Module, v.ModuleVersion)
	}
	if v.Revision != "" {
		rev := v.Revision
		if v.RevisionTime != "" {
			rev += " " + v.RevisionTime
		}
		if v.Modified {
			rev += " (modified)"
		}
		fmt.Fprintf(&b, "revision %s\n", rev)
	}
	fmt.Fprintf(&b, "go       %s %s\n", v.Go, v.Platform)
	return b.String()
}
