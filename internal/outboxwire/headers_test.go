package outboxwire

import (
	"encoding/json"
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
	b, err := EncodeHeaders(h)
	require.NoError(t, err)
	got, err := DecodeHeaders(b)
	require.NoError(t, err)
	want := amqp.Table{}
	for k, v := range h {
		want[k] = v
	}
	want["int"] = int64(42) // int goes on the wire as int64
	require.Equal(t, want, got)

	empty, err := EncodeHeaders(nil)
	require.NoError(t, err)
	got, err = DecodeHeaders(empty)
	require.NoError(t, err)
	require.Nil(t, got)
}

func TestHeadersRejectUnsupported(t *testing.T) {
	t.Parallel()
	_, err := EncodeHeaders(amqp.Table{"bad": struct{}{}})
	require.Error(t, err)
}

// encodeGeneral and decodeGeneral are EncodeHeaders and DecodeHeaders
// without their fast path for plain strings.
func encodeGeneral(t *testing.T, h amqp.Table) []byte {
	t.Helper()
	m, err := encodeTable(h)
	require.NoError(t, err)
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

func decodeGeneral(b []byte) (amqp.Table, error) {
	var m map[string]taggedValue
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return nil, nil //nolint:nilnil // as DecodeHeaders
	}
	return decodeTable(m)
}

// jsonbLayout rewrites compact JSON as PostgreSQL's jsonb prints it: a
// space after each colon and comma outside strings.
func jsonbLayout(b []byte) []byte {
	var out []byte
	in := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		out = append(out, c)
		switch {
		case in && c == '\\':
			i++
			out = append(out, b[i])
		case c == '"':
			in = !in
		case !in && (c == ':' || c == ','):
			out = append(out, ' ')
		}
	}
	return out
}

func TestHeadersPlainStringsFastPath(t *testing.T) {
	t.Parallel()
	for name, h := range map[string]amqp.Table{
		"key and trace": {"x-idempotency-key": "order-1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		"one":           {"a": "b"},
		"empty value":   {"k": ""},
		"empty key":     {"": "v"},
		"html":          {"k": "<a&b>"},
		"quote":         {"k": `say "hi"`},
		"backslash":     {`k\`: "v"},
		"unicode":       {"k": "é"},
		"control":       {"k": "a\nb"},
		"not a string":  {"k": "v", "n": int32(1)},
		"nine keys":     {"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6", "g": "7", "h": "8", "i": "9"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			want := encodeGeneral(t, h)
			got, err := EncodeHeaders(h)
			require.NoError(t, err)
			require.Equal(t, string(want), string(got), "the bytes the general encoding writes")
			for _, b := range [][]byte{want, jsonbLayout(want)} {
				wantT, wantErr := decodeGeneral(b)
				gotT, gotErr := DecodeHeaders(b)
				require.Equal(t, wantErr == nil, gotErr == nil, "%s", b)
				require.Equal(t, wantT, gotT, "%s", b)
			}
		})
	}
}

func TestHeadersFastPathFallsBack(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{}`, ` { } `, `{"k": {"t": "string", "v": "x"}}`, `{"k":{"v":"x","t":"string"}}`,
		`{"k":{"t":"int32","v":5}}`, `{"k":{"t":"string"}}`, `{"k":{"t":"string","v":"a\u00e9"}}`,
		`{"k":{"t":"string","v":"x"},}`, `{"k":{"t":"string","v":"x"}} x`, `{"k":{"t":"string","v":"x"`,
		`{"a":{"t":"string","v":"1"},"a":{"t":"string","v":"2"}}`, `[]`, `null`, ``,
	} {
		wantT, wantErr := decodeGeneral([]byte(in))
		gotT, gotErr := DecodeHeaders([]byte(in))
		require.Equal(t, wantErr == nil, gotErr == nil, "%s", in)
		require.Equal(t, wantT, gotT, "%s", in)
	}
}

func FuzzHeadersFastPathMatchesGeneral(f *testing.F) {
	f.Add("x-idempotency-key", "order-1", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	f.Add("k", "<&>", "", "é")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		h := amqp.Table{k1: v1, k2: v2}
		want := encodeGeneral(t, h)
		got, err := EncodeHeaders(h)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
		for _, b := range [][]byte{want, jsonbLayout(want)} {
			wantT, wantErr := decodeGeneral(b)
			gotT, gotErr := DecodeHeaders(b)
			require.Equal(t, wantErr == nil, gotErr == nil, "%s", b)
			require.Equal(t, wantT, gotT, "%s", b)
		}
	})
}

func FuzzDecodeHeadersMatchesGeneral(f *testing.F) {
	f.Add([]byte(`{"k": {"t": "string", "v": "x"}}`))
	f.Add([]byte(`{"k":{"t":"string","v":"x"},"n":{"t":"int32","v":1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		wantT, wantErr := decodeGeneral(b)
		gotT, gotErr := DecodeHeaders(b)
		require.Equal(t, wantErr == nil, gotErr == nil, "%q", b)
		if wantErr == nil {
			require.Equal(t, wantT, gotT, "%q", b)
		}
	})
}

var benchHeaders = amqp.Table{
	"x-idempotency-key": "order-1234567",
	"traceparent":       "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
}

func BenchmarkEncodeHeaders(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := EncodeHeaders(benchHeaders); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeHeaders(b *testing.B) {
	enc, err := EncodeHeaders(benchHeaders)
	if err != nil {
		b.Fatal(err)
	}
	enc = jsonbLayout(enc) // as the claim reads it back
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeHeaders(enc); err != nil {
			b.Fatal(err)
		}
	}
}
