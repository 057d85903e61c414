package outbox

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestHeadersRoundTrip(t *testing.T) {
	t.Parallel()
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := amqp.Table{
		"nil": nil, "bool": true, "u8": uint8(7), "i8": int8(-7), "i16": int16(-300), "u16": uint16(300),
		"i32": int32(-70000), "u32": uint32(70000), "i64": int64(1) << 60, "int": 42,
		"f32": float32(1.5), "f64": 2.25, "s": "text", "b": []byte{0, 1, 2},
		"t": when, "d": amqp.Decimal{Scale: 2, Value: 1234},
		"table": amqp.Table{"inner": "x", "n": int32(1)},
		"array": []any{"a", int32(2), amqp.Table{"k": true}},
	}
	b, err := encodeHeaders(h)
	require.NoError(t, err)
	got, err := decodeHeaders(b)
	require.NoError(t, err)
	want := amqp.Table{}
	for k, v := range h {
		want[k] = v
	}
	want["int"] = int64(42) // int goes on the wire as int64
	require.Equal(t, want, got)

	empty, err := encodeHeaders(nil)
	require.NoError(t, err)
	got, err = decodeHeaders(empty)
	require.NoError(t, err)
	require.Nil(t, got)
}

func TestHeadersRejectUnsupported(t *testing.T) {
	t.Parallel()
	_, err := encodeHeaders(amqp.Table{"bad": struct{}{}})
	require.Error(t, err)
}

func TestPrepareValidates(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		msg  Message
		want error
	}{
		"no destination": {Message{ID: "x"}, ErrNoDestination},
		"no id or key":   {Message{RoutingKey: "q"}, ErrNoID},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := prepare(t.Context(), tc.msg)
			require.ErrorIs(t, err, tc.want)
		})
	}
	r, err := prepare(t.Context(), Message{Exchange: "ex", ID: "given"})
	require.NoError(t, err)
	require.Equal(t, "given", r.id)
}

func TestDeriveID(t *testing.T) {
	t.Parallel()
	id := DeriveID("ex", "rk", "key-1")
	require.Equal(t, id, DeriveID("ex", "rk", "key-1"), "stable")
	require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id)
	require.NotEqual(t, id, DeriveID("ex", "rk2", "key-1"), "destination matters")
	require.NotEqual(t, DeriveID("a", "bc", "k"), DeriveID("ab", "c", "k"), "fields are length-prefixed")
}
