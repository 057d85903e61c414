package consumer_test

import (
	"context"
	"crypto/sha256"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/retry"
)

// keyed is a payload whose idempotency key is its Key field, as sent.
type keyed struct {
	Key string `json:"key"`
}

func (k keyed) IdempotencyKey() string { return k.Key }

// printed is a payload that chooses its own fingerprint.
type printed struct {
	ID   string `json:"id"`
	Note string `json:"note"`
}

func (p printed) IdempotencyKey() string { return "printed:" + p.ID }
func (p printed) Fingerprint() []byte    { return []byte("fp:" + p.ID) }

// decodeRoute registers a handler of T on a fresh router and returns the
// route's complete handler and a pointer to the last message it saw.
func decodeRoute[T any](t *testing.T) (inboxtype.DeliveryHandler, **inboxtype.Message[T]) {
	t.Helper()
	r := consumer.NewRouter()
	var seen *inboxtype.Message[T]
	consumer.Register(r, "decode", inboxtype.HandlerFunc[T](func(_ context.Context, msg *inboxtype.Message[T]) error {
		seen = msg
		return nil
	}), nil)
	return r.Routes()[0].Handler, &seen
}

func deliver(t *testing.T, h inboxtype.DeliveryHandler, body []byte) (*inboxtype.Delivery, error) {
	t.Helper()
	d := inboxtype.NewDelivery("decode", "decode", "w1", &amqp.Delivery{Body: body})
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

func TestRegister_InvalidKeyIsPermanent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		key  string
		want string // in the error; "" for a valid key
	}{
		{"plain", "payment:o-1", ""},
		{"inner spaces and tab", "payment:a b\tc", "control character"},
		{"unicode", "payment:zoë-€", ""},
		{"surrounding spaces kept as sent", " o-1 ", ""},
		{"at the limit", strings.Repeat("k", inboxtype.MaxKeyLen), ""},
		{"empty", "", "empty"},
		{"only spaces", "   ", "only whitespace"},
		{"only unicode whitespace", "\u00a0\u2003\u3000", "only whitespace"},
		{"CR LF", "payment:a\r\nb", "control character"},
		{"NUL", "payment:a\x00b", "control character"},
		{"DEL", "payment:a\x7fb", "control character"},
		{"unit separator", "payment:\x1f", "control character"},
		{"over the limit", strings.Repeat("k", inboxtype.MaxKeyLen+1), "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, seen := decodeRoute[keyed](t)
			body, err := consumer.JSON.Encode(keyed{Key: tt.key})
			require.NoError(t, err)
			_, err = deliver(t, h, body)
			require.Equal(t, tt.want == "", inboxtype.ValidKey(tt.key) == nil, "ValidKey(%q)", tt.key)
			if tt.want == "" {
				require.NoError(t, err)
				require.Equal(t, tt.key, (*seen).Key, "the key is used exactly as sent")
				return
			}
			dec := retry.Classify(err)
			require.Equal(t, retry.KindPermanent, dec.Kind, "%v", err)
			require.Equal(t, retry.ReasonInvalid, dec.Reason)
			require.ErrorContains(t, err, tt.want)
			require.ErrorContains(t, err, "idempotency key")
			require.Nil(t, *seen, "the handler never sees an invalid key")
		})
	}
}

func TestRegister_SetsTheFingerprint(t *testing.T) {
	t.Parallel()
	// A payload without a Fingerprint method: the SHA-256 of the raw body.
	h, seen := decodeRoute[keyed](t)
	body := []byte(`{"key":"k-1", "extra": 1}`)
	d, err := deliver(t, h, body)
	require.NoError(t, err)
	sum := sha256.Sum256(body)
	require.Equal(t, sum[:], d.Fingerprint)
	require.Equal(t, d.Fingerprint, (*seen).Fingerprint(), "the message reports the delivery's fingerprint")

	// A Fingerprinter chooses its own.
	hp, seenp := decodeRoute[printed](t)
	d, err = deliver(t, hp, []byte(`{"id":"p-1","note":"any"}`))
	require.NoError(t, err)
	require.Equal(t, []byte("fp:p-1"), d.Fingerprint)
	require.Equal(t, []byte("fp:p-1"), (*seenp).Fingerprint())

	// A message built without Register (a test, a tool) computes it the
	// same way.
	msg := &inboxtype.Message[printed]{Body: printed{ID: "p-2"}}
	require.Equal(t, []byte("fp:p-2"), msg.Fingerprint())
	raw, err := consumer.JSON.Encode(keyed{Key: "k-2"})
	require.NoError(t, err)
	msgRaw := &inboxtype.Message[keyed]{Body: keyed{Key: "k-2"}, Delivery: inboxtype.NewDelivery("q", "q", "w", &amqp.Delivery{Body: raw})}
	sum = sha256.Sum256(raw)
	require.Equal(t, sum[:], msgRaw.Fingerprint())
}
