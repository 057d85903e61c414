package clip_test

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/clip"
)

func TestText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		in    string
		limit int
		want  string
	}{
		{"short text is kept", "boom", 1024, "boom"},
		{"text at the limit is kept", strings.Repeat("a", 64), 64, strings.Repeat("a", 64)},
		{"long text is cut with a marker", strings.Repeat("7", 100), 64,
			strings.Repeat("7", 64-len("… [truncated from 100 bytes]")) + "… [truncated from 100 bytes]"},
		{"a rune is never split", strings.Repeat("é", 50), 40,
			strings.Repeat("é", 5) + "… [truncated from 100 bytes]"},
		{"a limit too small for the marker cuts without one", "abcdefghij", 4, "abcd"},
		{"a negative limit gives nothing", "abc", -1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := clip.Text(tt.in, tt.limit)
			require.Equal(t, tt.want, got)
			require.LessOrEqual(t, len(got), max(tt.limit, 0))
			require.True(t, utf8.ValidString(got))
		})
	}
}

func TestText_HugeNumberStaysWithinTheLimit(t *testing.T) {
	t.Parallel()
	in := "json: cannot unmarshal number " + strings.Repeat("9", 10<<20) + " into int64"
	got := clip.Text(in, clip.Limit)
	require.Len(t, got, clip.Limit)
	require.True(t, strings.HasPrefix(got, "json: cannot unmarshal number 999"))
	require.True(t, strings.HasSuffix(got, "… [truncated from "+strconv.Itoa(len(in))+" bytes]"), got[900:])
}
