// Package clip bounds text that reaches logs and message headers. An
// error's text can quote a payload of any size (a decode error quotes the
// number it could not parse), and one log line or header per delivery must
// stay small whatever the producer sent. It has its own home so that every
// layer that writes such text cuts it the same way and says so.
package clip

import (
	"strconv"
	"unicode/utf8"
)

// Limit is the bound, in bytes, on one text in a log line that may come
// from a payload (an error, an idempotency key): 1 KiB, as the x-error
// header of retries and dead letters.
const Limit = 1024

// Text returns s unchanged if it has at most limit bytes. A longer s is cut
// on a UTF-8 boundary and ends with a marker that says it was cut and how
// long it was ("… [truncated from 10485790 bytes]"); the result, marker
// included, has at most limit bytes. A limit too small for the marker cuts
// without one.
func Text(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	limit = max(limit, 0)
	marker := "… [truncated from " + strconv.Itoa(len(s)) + " bytes]"
	keep := limit - len(marker)
	if keep < 0 {
		keep, marker = limit, ""
	}
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + marker
}
