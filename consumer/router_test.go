package consumer_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/retry"
)

// keyed is a payload whose idempotency key is its Key field, as sent.
type keyed struct {
	Key string `json:"key"`
}

func (k keyed) IdempotencyKey() string { return k.Key }

// decodeRoute registers a handler of T on a fresh router and returns the
// route's complete handler and a pointer to the last message it saw.
func decodeRoute[T any](t *testing.T) (consumer.DeliveryHandler, **consumer.Message[T]) {
	t.Helper()
	r := consumer.NewRouter()
	var seen *consumer.Message[T]
	consumer.Register(r, "decode", consumer.HandlerFunc[T](func(_ context.Context, msg *consumer.Message[T]) error {
		seen = msg
		return nil
	}), nil)
	return r.Routes()[0].Handler, &seen
}

func deliver(t *testing.T, h consumer.DeliveryHandler, body []byte) (*consumer.Delivery, error) {
	t.Helper()
	d := consumer.NewDelivery("decode", "decode", "w1", &amqp.Delivery{Body: body})
	return d, h(t.Context(), d)
}

func TestRegister_InvalidUTF8IsADecodeError(t *testing.T) {
	t.Parallel()
	// Go's JSON decoder would replace each invalid byte by U+FFFD, so both
	// bodies would decode to the same key: two orders merged into one.
	for _, body := range []string{
		"{\"key\":\"p2-bad\xffX\"}",
		"{\"key\":\"p2-bad\xfeX\"}",
		"{\"key\":\"ok\",\"extra\":\"\xc3\"}", // a truncated sequence in an ignored field
	} {
		h, seen := decodeRoute[keyed](t)
		_, err := deliver(t, h, []byte(body))
		dec := retry.Classify(err)
		require.Equal(t, retry.KindPermanent, dec.Kind, "body %q: %v", body, err)
		require.Equal(t, retry.ReasonDecode, dec.Reason, "body %q", body)
		require.ErrorContains(t, err, "UTF-8")
		require.Nil(t, *seen, "the handler never sees body %q", body)
	}
}

func TestJSON_DecodeRejectsInvalidUTF8(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
		ok   bool
	}{
		{"ASCII", `{"key":"a"}`, true},
		{"multi-byte", `{"key":"zoë €"}`, true},
		{"escaped replacement character", `{"key":"\ufffd"}`, true},
		{"raw replacement character", "{\"key\":\"\uFFFD\"}", true},
		{"invalid byte", "{\"key\":\"\xff\"}", false},
		{"surrogate half", "{\"key\":\"\xed\xa0\x80\"}", false},
		{"overlong encoding", "{\"key\":\"\xc0\xaf\"}", false},
		{"truncated sequence", "{\"key\":\"\xe2\x82\"}", false},
		{"invalid byte outside strings", "{\"key\":\"a\"}\xff", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var v keyed
			err := consumer.JSON.Decode([]byte(tt.body), &v)
			if tt.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, "not valid UTF-8")
		})
	}
}
