package consumer

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/retry"
)

// fuzzPayment is a payment-style payload: a Keyer and a Validator.
type fuzzPayment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

func (p fuzzPayment) IdempotencyKey() string {
	if p.OrderID == "" {
		return ""
	}
	return "payment:" + p.OrderID
}

func (p fuzzPayment) Validate() error {
	if p.AmountCents <= 0 {
		return errors.New("amount_cents must be positive")
	}
	return nil
}

// FuzzRegisterDecode feeds arbitrary bodies and headers through the adapter
// that Register builds. It must never panic; a body the handler never sees
// fails permanently (decode, invalid or an invalid key), and a body it sees
// is valid UTF-8 and has a valid key, that of its business identity, and a
// fingerprint.
func FuzzRegisterDecode(f *testing.F) {
	for _, s := range []string{
		`{"order_id":"o-1","amount_cents":100,"currency":"EUR"}`,
		`{"order_id":"","amount_cents":100}`,
		`{"order_id":"o-2","amount_cents":0}`,
		`{"order_id":"o-3","amount_cents":-1}`,
		`{not json`,
		`[]`,
		`null`,
		`{"order_id":7}`,
		`{"order_id":"o-4","amount_cents":1e400}`,
		"",
		"\xff\xfe",
		"{\"order_id\":\"p2-bad\xffX\",\"amount_cents\":1}",
		`{"order_id":"a\r\nb","amount_cents":1}`,
		`{"order_id":" ","amount_cents":1}`,
	} {
		f.Add([]byte(s), "1")
	}
	f.Fuzz(func(t *testing.T, body []byte, attempt string) {
		r := NewRouter()
		var seen *inboxtype.Message[fuzzPayment]
		Register(r, "fuzz", inboxtype.HandlerFunc[fuzzPayment](func(_ context.Context, msg *inboxtype.Message[fuzzPayment]) error {
			seen = msg
			return nil
		}), nil)
		route := r.Routes()[0]
		d := inboxtype.NewDelivery("fuzz", route.Opts.Namespace, "fuzz", &amqp.Delivery{Body: body, Headers: amqp.Table{inboxtype.HeaderAttempt: attempt}})
		if d.Attempt < 1 {
			t.Fatalf("attempt %d from header %q: want ≥ 1", d.Attempt, attempt)
		}
		err := route.Handler(context.Background(), d)
		if seen == nil {
			dec := retry.Classify(err)
			if dec.Kind != retry.KindPermanent {
				t.Fatalf("body %q not handled but classified %s (%v): a decode failure must be permanent", body, dec.Kind, err)
			}
			switch dec.Reason {
			case retry.ReasonDecode, retry.ReasonInvalid:
			default:
				t.Fatalf("body %q: reason %q, want decode or invalid", body, dec.Reason)
			}
			return
		}
		if err != nil {
			t.Fatalf("handled body %q returned %v", body, err)
		}
		if seen.Key == "" || seen.Key != "payment:"+seen.Body.OrderID || d.Key != seen.Key {
			t.Fatalf("body %q: key %q for order %q", body, seen.Key, seen.Body.OrderID)
		}
		if seen.Body.AmountCents <= 0 {
			t.Fatalf("body %q: invalid payload reached the handler", body)
		}
		if !utf8.Valid(body) || inboxtype.ValidKey(seen.Key) != nil {
			t.Fatalf("body %q: an invalid body or key %q reached the handler", body, seen.Key)
		}
		if len(d.Fingerprint) == 0 || !bytes.Equal(d.Fingerprint, seen.Fingerprint()) {
			t.Fatalf("body %q: fingerprint %x, message fingerprint %x", body, d.Fingerprint, seen.Fingerprint())
		}
	})
}

// FuzzDeathHeaders feeds x-death tables (well-formed, truncated or of the
// wrong types) and x-error headers to the DLQ replay's header handling:
// never a panic, and a replayed copy always starts again at attempt 1
// without the broker's death headers.
func FuzzDeathHeaders(f *testing.F) {
	f.Add("rejected", int64(1), "decode: bad json", "decode", uint8(0))
	f.Add("expired", int64(3), "", "expired", uint8(1))
	f.Add("", int64(-1), "exhausted: x", "", uint8(2))
	f.Add("maxlen", int64(0), "", "rejected", uint8(3))
	f.Fuzz(func(t *testing.T, reason string, count int64, xerr, want string, shape uint8) {
		var death any
		switch shape % 5 {
		case 0:
			death = []any{amqp.Table{"reason": reason, "count": count, "queue": "q", "exchange": ""}}
		case 1:
			death = []any{amqp.Table{"reason": count}}
		case 2:
			death = []any{reason, count}
		case 3:
			death = []any{}
		default:
			death = amqp.Table{"reason": reason}
		}
		h := amqp.Table{"x-death": death, inboxtype.HeaderAttempt: count}
		if xerr != "" {
			h[inboxtype.HeaderError] = xerr
		}
		_ = replayMatches("q", "", h, &ReplayOpts{Reason: want})
		_ = replayMatches("q", "", h, &ReplayOpts{Key: reason})
		_ = inboxtype.DeadLetterReason(h)
		_ = inboxtype.DeadLetterOrigin(h)
		out := cloneTable(h)
		setReplayHeaders(out, int(count%1000))
		if _, ok := out["x-death"]; ok {
			t.Fatal("x-death kept on a replayed copy")
		}
		if _, ok := out[inboxtype.HeaderError]; ok {
			t.Fatal("x-error kept on a replayed copy")
		}
		if got := inboxtype.HeaderInt(out, inboxtype.HeaderAttempt); got != 1 {
			t.Fatalf("replayed attempt %d, want 1", got)
		}
	})
}
