package inboxtype

import (
	"strconv"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// FuzzHeaderInt reads integer headers of every AMQP type the broker or a
// producer may send: never a panic, and a value that matches its source.
func FuzzHeaderInt(f *testing.F) {
	f.Add(uint8(0), int64(3), "3")
	f.Add(uint8(4), int64(-1), "-1")
	f.Add(uint8(8), int64(0), "x")
	f.Add(uint8(9), int64(1<<40), "99999999999999999999")
	f.Fuzz(func(t *testing.T, kind uint8, n int64, s string) {
		var v any
		want := 0
		switch kind % 11 {
		case 0:
			v, want = int32(n), int(int32(n))
		case 1:
			v, want = int64(n), int(n)
		case 2:
			v, want = int16(n), int(int16(n))
		case 3:
			v, want = int8(n), int(int8(n))
		case 4:
			v, want = uint8(n), int(uint8(n))
		case 5:
			v, want = uint16(n), int(uint16(n))
		case 6:
			v, want = uint32(n), int(uint32(n))
		case 7:
			v, want = int(n), int(n)
		case 8:
			v = s
			if i, err := strconv.Atoi(s); err == nil {
				want = i
			}
		case 9:
			v = []byte(s) // not an integer type: reads as 0
		default:
			v = amqp.Table{"nested": n}
		}
		h := amqp.Table{HeaderDeliveryCount: v, HeaderAttempt: v}
		if got := HeaderInt(h, HeaderDeliveryCount); got != want {
			t.Fatalf("HeaderInt(%T %v) = %d, want %d", v, v, got, want)
		}
		d := NewDelivery("q", "q", "w", &amqp.Delivery{Headers: h})
		if d.Attempt < 1 || d.DeliveryCount != want {
			t.Fatalf("delivery from %T %v: attempt %d, delivery count %d", v, v, d.Attempt, d.DeliveryCount)
		}
	})
}
