package envelope

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// deriveIDReference is DeriveID as first written (fmt and hex of the
// whole sum): the ids already in outboxes and inboxes were derived with
// it, so DeriveID must keep giving the same bytes.
func deriveIDReference(exchange, routingKey, key string) string {
	h := sha256.New()
	for _, s := range []string{exchange, routingKey, key} {
		_, _ = fmt.Fprintf(h, "%d:%s;", len(s), s)
	}
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = (u[6] & 0x0f) | 0x80
	u[8] = (u[8] & 0x3f) | 0x80
	b := hex.EncodeToString(u[:])
	return b[0:8] + "-" + b[8:12] + "-" + b[12:16] + "-" + b[16:20] + "-" + b[20:32]
}

func TestDeriveIDKeepsItsValues(t *testing.T) {
	t.Parallel()
	// Pinned: a change here changes every derived message id.
	if got, want := DeriveID("ex", "rk", "key-1"), deriveIDReference("ex", "rk", "key-1"); got != want {
		t.Fatalf("DeriveID = %s, reference %s", got, want)
	}
	long := strings.Repeat("k", 300) // past the stack buffer
	for _, c := range [][3]string{
		{"", "", ""}, {"", "q", "order:1"}, {"a", "bc", "k"}, {"ab", "c", "k"},
		{"payments", "payment.completed", "pay-42"}, {"é", "ü", "日本"}, {long, long, long},
	} {
		if got, want := DeriveID(c[0], c[1], c[2]), deriveIDReference(c[0], c[1], c[2]); got != want {
			t.Errorf("DeriveID%q = %s, reference %s", c, got, want)
		}
	}
}

func FuzzDeriveIDMatchesReference(f *testing.F) {
	f.Add("ex", "rk", "key-1")
	f.Fuzz(func(t *testing.T, exchange, routingKey, key string) {
		if got, want := DeriveID(exchange, routingKey, key), deriveIDReference(exchange, routingKey, key); got != want {
			t.Fatalf("DeriveID(%q, %q, %q) = %s, reference %s", exchange, routingKey, key, got, want)
		}
	})
}

func BenchmarkDeriveID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = DeriveID("payments.events", "payment.completed", "order-1234567")
	}
}

func BenchmarkDeriveIDReference(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = deriveIDReference("payments.events", "payment.completed", "order-1234567")
	}
}
