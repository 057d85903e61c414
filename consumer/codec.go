package consumer

import (
	"encoding/json"
)

// Codec decodes payloads for typed handlers (and encodes them for
// publishers and tests).
type Codec interface {
	// Decode parses data into v, a non-nil pointer.
	Decode(data []byte, v any) error
	// Encode serialises v.
	Encode(v any) ([]byte, error)
	// ContentType is the AMQP content type Encode produces.
	ContentType() string
}

// JSON is the default [Codec]: encoding/json, unknown fields ignored so that
// producers can add fields without breaking consumers.
var JSON Codec = jsonCodec{}

type jsonCodec struct{}

func (jsonCodec) Decode(data []byte, v any) error { return json.Unmarshal(data, v) }
func (jsonCodec) Encode(v any) ([]byte, error)    { return json.Marshal(v) }
func (jsonCodec) ContentType() string             { return "application/json" }
