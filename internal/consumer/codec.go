package consumer

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
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
// producers can add fields without breaking consumers. A body that is not
// valid UTF-8 is a decode error: encoding/json would replace each invalid
// byte with U+FFFD, so two different bodies could decode to the same
// payload and the same idempotency key.
var JSON Codec = jsonCodec{}

type jsonCodec struct{}

func (jsonCodec) Decode(data []byte, v any) error {
	if !utf8.Valid(data) {
		return errNotUTF8
	}
	return json.Unmarshal(data, v)
}
func (jsonCodec) Encode(v any) ([]byte, error) { return json.Marshal(v) }
func (jsonCodec) ContentType() string          { return "application/json" }

var errNotUTF8 = errors.New("consumer: body is not valid UTF-8")
