package outboxwire

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
)

// The headers column keeps AMQP's field types, so a header written as int32
// goes out as int32: every value is stored as {"t": type, "v": value}.
// Plain JSON would turn every number into a float.

type taggedValue struct {
	T string          `json:"t"`
	V json.RawMessage `json:"v,omitempty"`
}

type decimalValue struct {
	Scale uint8 `json:"s"`
	Value int32 `json:"v"`
}

// EncodeHeaders encodes h for the outbox table's headers column (nil
// gives an empty object). It rejects values that AMQP cannot carry.
func EncodeHeaders(h amqp.Table) ([]byte, error) {
	if h == nil {
		return []byte("{}"), nil
	}
	if b, ok := encodePlainStrings(h); ok {
		return b, nil
	}
	if err := h.Validate(); err != nil {
		return nil, fmt.Errorf("outboxwire: headers: %w", err)
	}
	m, err := encodeTable(h)
	if err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

func encodeTable(h amqp.Table) (map[string]taggedValue, error) {
	m := make(map[string]taggedValue, len(h))
	for k, v := range h {
		tv, err := encodeValue(v)
		if err != nil {
			return nil, fmt.Errorf("outboxwire: header %q: %w", k, err)
		}
		m[k] = tv
	}
	return m, nil
}

func encodeValue(v any) (taggedValue, error) {
	var (
		tag string
		raw any
	)
	switch x := v.(type) {
	case nil:
		return taggedValue{T: "nil"}, nil
	case bool:
		tag, raw = "bool", x
	case byte:
		tag, raw = "uint8", x
	case int8:
		tag, raw = "int8", x
	case int16:
		tag, raw = "int16", x
	case uint16:
		tag, raw = "uint16", x
	case int32:
		tag, raw = "int32", x
	case uint32:
		tag, raw = "uint32", x
	case int:
		tag, raw = "int64", int64(x)
	case int64:
		tag, raw = "int64", x
	case float32:
		tag, raw = "float32", x
	case float64:
		tag, raw = "float64", x
	case string:
		tag, raw = "string", x
	case []byte:
		tag, raw = "bytes", x
	case time.Time:
		tag, raw = "time", x.UTC().Format(time.RFC3339Nano)
	case amqp.Decimal:
		tag, raw = "decimal", decimalValue{Scale: x.Scale, Value: x.Value}
	case amqp.Table:
		t, err := encodeTable(x)
		if err != nil {
			return taggedValue{}, err
		}
		tag, raw = "table", t
	case []any:
		arr := make([]taggedValue, len(x))
		for i, e := range x {
			tv, err := encodeValue(e)
			if err != nil {
				return taggedValue{}, err
			}
			arr[i] = tv
		}
		tag, raw = "array", arr
	default:
		return taggedValue{}, fmt.Errorf("unsupported AMQP field type %T", v)
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return taggedValue{}, err
	}
	return taggedValue{T: tag, V: b}, nil
}

// DecodeHeaders is the inverse of EncodeHeaders (an empty object gives
// nil).
func DecodeHeaders(b []byte) (amqp.Table, error) {
	if t, ok := decodePlainStrings(b); ok {
		return t, nil
	}
	var m map[string]taggedValue
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("outboxwire: headers: %w", err)
	}
	if len(m) == 0 {
		return nil, nil //nolint:nilnil // a nil amqp.Table is the empty table
	}
	return decodeTable(m)
}

func decodeTable(m map[string]taggedValue) (amqp.Table, error) {
	t := make(amqp.Table, len(m))
	for k, tv := range m {
		v, err := decodeValue(tv)
		if err != nil {
			return nil, fmt.Errorf("outboxwire: header %q: %w", k, err)
		}
		t[k] = v
	}
	return t, nil
}

func decodeValue(tv taggedValue) (any, error) {
	intOf := func(bits int) (int64, error) { return strconv.ParseInt(string(tv.V), 10, bits) }
	uintOf := func(bits int) (uint64, error) { return strconv.ParseUint(string(tv.V), 10, bits) }
	switch tv.T {
	case "nil":
		return nil, nil //nolint:nilnil // a header whose value is nil
	case "bool":
		var b bool
		err := json.Unmarshal(tv.V, &b)
		return b, err
	case "uint8":
		n, err := uintOf(8)
		return uint8(n), err
	case "int8":
		n, err := intOf(8)
		return int8(n), err
	case "int16":
		n, err := intOf(16)
		return int16(n), err
	case "uint16":
		n, err := uintOf(16)
		return uint16(n), err
	case "int32":
		n, err := intOf(32)
		return int32(n), err
	case "uint32":
		n, err := uintOf(32)
		return uint32(n), err
	case "int64":
		return intOf(64)
	case "float32":
		f, err := strconv.ParseFloat(string(tv.V), 32)
		return float32(f), err
	case "float64":
		return strconv.ParseFloat(string(tv.V), 64)
	case "string":
		var s string
		err := json.Unmarshal(tv.V, &s)
		return s, err
	case "bytes":
		var b []byte
		err := json.Unmarshal(tv.V, &b)
		return b, err
	case "time":
		var s string
		if err := json.Unmarshal(tv.V, &s); err != nil {
			return nil, err
		}
		return time.Parse(time.RFC3339Nano, s)
	case "decimal":
		var d decimalValue
		err := json.Unmarshal(tv.V, &d)
		return amqp.Decimal{Scale: d.Scale, Value: d.Value}, err
	case "table":
		var m map[string]taggedValue
		if err := json.Unmarshal(tv.V, &m); err != nil {
			return nil, err
		}
		return decodeTable(m)
	case "array":
		var arr []taggedValue
		if err := json.Unmarshal(tv.V, &arr); err != nil {
			return nil, err
		}
		out := make([]any, len(arr))
		for i, e := range arr {
			v, err := decodeValue(e)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	default:
		return nil, fmt.Errorf("unknown field type %q", tv.T)
	}
}

// The usual headers (the idempotency key, the trace context) are a few
// strings of plain ASCII. encodePlainStrings and decodePlainStrings handle
// those without encoding/json's reflection and per-value allocations; any
// other table goes the general way. Both give exactly what the general
// way gives (headers_test.go checks it).

// plainByte reports whether c needs no escaping in a JSON string, as
// encoding/json writes it (which escapes <, > and &) and reads it (which
// rewrites invalid UTF-8: only ASCII is taken here).
func plainByte(c byte) bool {
	return c >= 0x20 && c < 0x7f && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
}

func plainString(s string) bool {
	for i := range len(s) {
		if !plainByte(s[i]) {
			return false
		}
	}
	return true
}

// encodePlainStrings encodes h as EncodeHeaders would when every value is
// a string and every key and value is plain ASCII; ok is false otherwise.
func encodePlainStrings(h amqp.Table) (b []byte, ok bool) {
	const maxKeys = 8
	if len(h) > maxKeys {
		return nil, false
	}
	var stack [maxKeys][2]string // key, value
	kvs := stack[:0]
	size := 2
	for k, v := range h {
		s, isString := v.(string)
		if !isString || !plainString(k) || !plainString(s) {
			return nil, false
		}
		kvs = append(kvs, [2]string{k, s})
		size += len(k) + len(s) + len(`"":{"t":"string","v":""},`)
	}
	// encoding/json sorts a map's keys.
	slices.SortFunc(kvs, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	b = make([]byte, 0, size)
	b = append(b, '{')
	for i, kv := range kvs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, kv[0]...)
		b = append(b, `":{"t":"string","v":"`...)
		b = append(b, kv[1]...)
		b = append(b, `"}`...)
	}
	return append(b, '}'), true
}

// decodePlainStrings decodes b as DecodeHeaders would when b is an object
// of plain-ASCII keys whose values are all {"t": "string", "v": <plain
// ASCII string>}, in the layout encodePlainStrings writes or the one
// PostgreSQL's jsonb gives back (a space after each colon and comma); ok
// is false for anything else.
func decodePlainStrings(b []byte) (t amqp.Table, ok bool) {
	p := plainParser{b: b}
	if !p.byte('{') {
		return nil, false
	}
	if p.byte('}') {
		return nil, p.end() // a nil amqp.Table is the empty table
	}
	for {
		k, ok := p.str()
		if !ok || !p.byte(':') || !p.byte('{') {
			return nil, false
		}
		// The tag first: encoding/json and jsonb both write "t" before "v".
		if tk, ok := p.str(); !ok || string(tk) != "t" || !p.byte(':') {
			return nil, false
		}
		if tag, ok := p.str(); !ok || string(tag) != "string" || !p.byte(',') {
			return nil, false
		}
		if vk, ok := p.str(); !ok || string(vk) != "v" || !p.byte(':') {
			return nil, false
		}
		v, ok := p.str()
		if !ok || !p.byte('}') {
			return nil, false
		}
		if t == nil {
			t = make(amqp.Table, 2)
		}
		t[headerName(k)] = string(v)
		if p.byte('}') {
			return t, p.end()
		}
		if !p.byte(',') {
			return nil, false
		}
	}
}

// headerName returns b as a string, without a copy for the names most
// rows carry.
func headerName(b []byte) string {
	switch string(b) {
	case inboxtype.HeaderIdempotencyKey:
		return inboxtype.HeaderIdempotencyKey
	case "traceparent":
		return "traceparent"
	case "tracestate":
		return "tracestate"
	}
	return string(b)
}

// plainParser reads the JSON subset decodePlainStrings accepts.
type plainParser struct {
	b []byte
	i int
}

func (p *plainParser) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

// byte consumes c, after any white space.
func (p *plainParser) byte(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str consumes a string of plain bytes, after any white space, and
// returns its content (a part of p.b).
func (p *plainParser) str() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) && p.b[p.i] != '"' {
		if !plainByte(p.b[p.i]) {
			return nil, false
		}
		p.i++
	}
	if p.i == len(p.b) {
		return nil, false
	}
	s := p.b[start:p.i]
	p.i++
	return s, true
}

// end reports whether only white space is left.
func (p *plainParser) end() bool {
	p.space()
	return p.i == len(p.b)
}
