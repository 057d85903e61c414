package chaos_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/chaos"
)

// A bad Config is refused before anything is built, started or published,
// with an error that names the setting.
func TestRun_RefusesAnUnknownLock(t *testing.T) {
	t.Parallel()
	rep, err := chaos.Run(t.Context(), &chaos.Config{Lock: "yes", WorkDir: t.TempDir()})
	require.ErrorContains(t, err, `unknown Lock "yes"`)
	require.Nil(t, rep)
}
