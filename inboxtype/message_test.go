package inboxtype_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
)

// A json.RawMessage is the handler's own encoding: SetResult keeps its
// bytes (json.Marshal would compact them and escape HTML), checking only
// that they are JSON. Any other value is encoded with json.Marshal.
func TestMessage_SetResult(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		v    any
		want string
		err  string
	}{
		{name: "raw message kept as given", v: json.RawMessage(`{"b":1,  "a":[2,1], "h":"<&>"}`), want: `{"b":1,  "a":[2,1], "h":"<&>"}`},
		{name: "nil raw message is null", v: json.RawMessage(nil), want: `null`},
		{name: "raw message that is not JSON", v: json.RawMessage(`{"b":`), err: "inboxtype: result is not valid JSON"},
		{name: "value", v: map[string]int{"b": 1, "a": 2}, want: `{"a":2,"b":1}`},
		{name: "nil", v: nil, want: `null`},
		{name: "unencodable", v: func() {}, err: "inboxtype: encode result"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var m inboxtype.Message[struct{}]
			err := m.SetResult(tt.v)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				require.Nil(t, m.Result())
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, string(m.Result()))
		})
	}
}

// The result is the message's own copy: changing the slice passed in
// afterwards does not change it.
func TestMessage_SetResultCopiesARawMessage(t *testing.T) {
	t.Parallel()
	raw := json.RawMessage(`{"a":1}`)
	var m inboxtype.Message[struct{}]
	require.NoError(t, m.SetResult(raw))
	raw[5] = '2'
	require.Equal(t, `{"a":1}`, string(m.Result()))
}
