package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/amqptest"
	"github.com/inboxmq/inboxmq/internal/consumer"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// fullProps has every basic property set, so that ContentHeaderSize (which
// counts every property as present) is the exact size on the wire.
func fullProps(headers amqp.Table) amqp.Publishing {
	return amqp.Publishing{
		Headers: headers, ContentType: "application/json", ContentEncoding: "identity",
		DeliveryMode: amqp.Persistent, Priority: 1, CorrelationId: "corr", ReplyTo: "reply",
		Expiration: "600000", MessageId: "m-1", Timestamp: time.Unix(1_700_000_000, 0),
		Type: "order", UserId: "guest", AppId: "app",
	}
}

// Every field type amqp091 encodes, nested too.
var allTypes = amqp.Table{
	"bool": true, "byte": byte(1), "int8": int8(-1), "int16": int16(-2), "uint16": uint16(3),
	"int": 4, "int32": int32(5), "uint32": uint32(6), "int64": int64(7), "float32": float32(8.5),
	"float64": 9.25, "decimal": amqp.Decimal{Scale: 2, Value: 1234}, "string": "héllo", "bytes": []byte{1, 2},
	"time": time.Unix(1_700_000_000, 0), "nil": nil,
	"array": []any{"a", int32(1), amqp.Table{"k": "v"}, []any{int64(2)}},
	"table": amqp.Table{"inner": amqp.Table{"deep": "x"}, "n": int16(1)},
}

// The size estimate is exact for a message with every property set (and an
// upper bound otherwise): a content header of exactly frame_max bytes is
// accepted and a larger one closes the connection, so a copy that fitFrame
// sized is never refused.
func TestContentHeaderSize_MatchesTheBroker(t *testing.T) {
	t.Parallel()
	queue := amqptest.QueueName(t)
	setupConn := amqptest.Dial(t)
	ch, err := setupConn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, false, false, false, false, amqp.Table{"x-expires": int32(60_000)})
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	publish := func(extra int) error {
		conn := amqptest.Dial(t)
		frameMax := conn.Config.FrameSize
		require.Positive(t, frameMax)
		h := amqp.Table{"pad": ""}
		for k, v := range allTypes {
			h[k] = v
		}
		msg := fullProps(h)
		h["pad"] = strings.Repeat("p", frameMax-consumer.ContentHeaderSize(&msg)+extra)
		require.Equal(t, frameMax+extra, consumer.ContentHeaderSize(&msg))
		pc, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, pc.Confirm(false))
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout())
		defer cancel()
		dc, err := pc.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, msg)
		if err != nil {
			return err
		}
		ok, err := dc.WaitContext(ctx)
		if err == nil && !ok {
			return errors.New("not confirmed: the broker closed the connection")
		}
		return err
	}
	require.NoError(t, publish(0), "a content header of exactly frame_max bytes is accepted")
	// RabbitMQ does not count a frame's 8 bytes of framing against
	// frame_max; the estimate does, so it is exact up to those 8.
	require.NoError(t, publish(8))
	require.Error(t, publish(9), "a larger one is refused")
	// (Not drained: amqp091 itself refuses to read the second one, whose
	// frame is larger than frame_max.)
	require.Equal(t, 2, amqptest.Depth(t, setupConn, queue))
}

func TestFitFrame(t *testing.T) {
	t.Parallel()
	big := func(n int) string { return strings.Repeat("x", n) }
	base := func(extra amqp.Table) amqp.Table {
		h := amqp.Table{
			inboxtype.HeaderError: "decode: bad json", inboxtype.HeaderAttempt: int64(1),
			inboxtype.HeaderOriginalQueue: "q", inboxtype.HeaderFirstFailedAt: "2025-01-01T00:00:00Z",
			inboxtype.HeaderLastFailedAt: "2025-01-01T00:00:00Z",
		}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	const frame = 4096
	for _, tc := range []struct {
		name      string
		headers   amqp.Table
		dropped   int
		kept      []string
		gone      []string
		errorEnd  string
		longProps bool // every short-string property at its longest
	}{
		{name: "fits", headers: base(amqp.Table{"a": big(100)}), kept: []string{"a"}},
		{
			name:    "largest original first",
			headers: base(amqp.Table{"a": big(3000), "b": big(2000), "c": big(10), "traceparent": "00-x"}),
			dropped: 1, kept: []string{"b", "c", "traceparent"}, gone: []string{"a"},
			errorEnd: "decode: bad json; original headers trimmed: 1 dropped",
		},
		{
			name:    "several, nested tables counted",
			headers: base(amqp.Table{"a": amqp.Table{"n": big(2000)}, "b": []any{big(2000)}, "c": []byte(big(2000))}),
			dropped: 2, gone: []string{"a", "b"}, kept: []string{"c"},
			errorEnd: "; original headers trimmed: 2 dropped",
		},
		{
			name:    "trace context goes only when the originals cannot make room",
			headers: base(amqp.Table{"a": big(100), "tracestate": big(5000), inboxtype.HeaderReplayCount: int64(2)}),
			dropped: 2, gone: []string{"a", "tracestate"}, kept: []string{inboxtype.HeaderReplayCount},
			errorEnd: "; original headers trimmed: 2 dropped",
		},
		{
			name:    "the key goes last",
			headers: base(amqp.Table{inboxtype.HeaderIdempotencyKey: big(5000), "a": big(10), "traceparent": "00-x"}),
			dropped: 3, gone: []string{"a", "traceparent", inboxtype.HeaderIdempotencyKey},
			errorEnd: "; original headers trimmed: 3 dropped",
		},
		{
			name: "the failure headers always stay, and fit the smallest frame",
			headers: base(amqp.Table{
				inboxtype.HeaderError: big(1024), inboxtype.HeaderOriginalQueue: big(255),
				inboxtype.HeaderFirstFailedAt: "2025-01-01T00:00:00.123456789+01:00", "a": big(400),
			}),
			dropped: 1, gone: []string{"a"}, kept: []string{inboxtype.HeaderOriginalQueue, inboxtype.HeaderFirstFailedAt},
			errorEnd: "; original headers trimmed: 1 dropped", longProps: true,
		},
		{
			name:    "x-error bounded with the note",
			headers: base(amqp.Table{inboxtype.HeaderError: "é" + big(1022), "a": big(4000)}),
			dropped: 1, gone: []string{"a"},
			errorEnd: "; original headers trimmed: 1 dropped",
		},
		{
			name:    "a copy without x-error gets one",
			headers: amqp.Table{"a": big(5000), inboxtype.HeaderReplayCount: int64(1)},
			dropped: 1, gone: []string{"a"}, kept: []string{inboxtype.HeaderReplayCount},
			errorEnd: "original headers trimmed: 1 dropped",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			msg := fullProps(tc.headers)
			if tc.longProps {
				l := big(255)
				msg.ContentType, msg.ContentEncoding, msg.CorrelationId, msg.ReplyTo = l, l, l, l
				msg.Expiration, msg.MessageId, msg.Type, msg.UserId, msg.AppId = l, l, l, l, l
			}
			before := len(tc.headers)
			require.Equal(t, tc.dropped, consumer.FitFrame(&msg, frame))
			require.Len(t, tc.headers, before, "the caller's table is not modified")
			for _, k := range tc.kept {
				require.Contains(t, msg.Headers, k)
			}
			for _, k := range tc.gone {
				require.NotContains(t, msg.Headers, k)
			}
			xerr, _ := msg.Headers[inboxtype.HeaderError].(string)
			if tc.dropped == 0 {
				require.Equal(t, "decode: bad json", xerr)
				return
			}
			require.True(t, strings.HasSuffix(xerr, tc.errorEnd), xerr)
			require.LessOrEqual(t, len(xerr), 1024)
			require.True(t, utf8.ValidString(xerr), "cut at a rune boundary")
			require.LessOrEqual(t, consumer.ContentHeaderSize(&msg), frame)
			require.Equal(t, 0, consumer.FitFrame(&msg, frame), "a fitted copy fits")
		})
	}
	msg := fullProps(amqp.Table{"a": big(1 << 20)})
	require.Equal(t, 0, consumer.FitFrame(&msg, 0), "frame_max 0: no limit")
}
