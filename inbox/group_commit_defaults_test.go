package inbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
)

// Group commit's defaults are resolved in one place: the concurrency a
// route needs to fill its batches follows them.
func TestGroupCommit_Concurrency(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		gc   *inbox.GroupCommit
		want int
	}{
		{"none", nil, 0},
		{"defaults: two batches of 256", &inbox.GroupCommit{}, 512},
		{"the batch settings", &inbox.GroupCommit{MaxBatch: 32, MaxInFlight: 4}, 128},
		{"a batch size set", &inbox.GroupCommit{MaxBatch: 64}, 128},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, tt.gc.Concurrency())
		})
	}
}
