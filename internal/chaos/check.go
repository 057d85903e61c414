package chaos

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Order is one valid payment order a scenario publishes.
type Order struct {
	ID          string
	AmountCents int64
	Currency    string
	// Copies is how many times it was published (1–3), each with its own
	// message id.
	Copies int
}

// Expect is what a scenario published, and so what the checker expects.
type Expect struct {
	// Orders must each have exactly one payments row, one ledger entry and
	// (with a gateway) one created charge.
	Orders []Order
	// Declined are orders the gateway refuses permanently (402): no row, no
	// charge, and a dead letter each.
	Declined []Order
	// Poison are invalid message bodies: no row, and a dead letter each.
	Poison [][]byte
}

// DeadLetter is one message found in the dead-letter queue.
type DeadLetter struct {
	Body  []byte
	Error string // the x-error header ("" when missing)
}

// Observed is what the runner saw besides the database.
type Observed struct {
	// Gateway is true when the scenario ran with the fake gateway; Calls are
	// then its recorded calls.
	Gateway bool
	Calls   []Charge
	// DeadLetters are the messages drained from <queue>.dlq.
	DeadLetters []DeadLetter
	// Leftover counts messages left in the work queue and its retry queues
	// after every worker stopped (an unacked delivery comes back as ready
	// when its worker stops, so it shows here too).
	Leftover map[string]int
}

// Result is the checker's verdict and the figures it measured.
type Result struct {
	// Violations are the broken guarantees, one line each; empty means pass.
	Violations []string
	// Payments and LedgerEntries count the rows found for the run's orders.
	Payments, LedgerEntries int
	// ChargesCreated counts charges the gateway created; GatewayCalls counts
	// every call; ExtraCalls is the raw calls above one per charged key.
	ChargesCreated, GatewayCalls, ExtraCalls int
}

// OK reports whether no guarantee was broken.
func (r *Result) OK() bool { return len(r.Violations) == 0 }

func (r *Result) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// maxListed bounds how many offenders of one kind a violation names.
const maxListed = 5

func listed(ids []string) string {
	sort.Strings(ids)
	if len(ids) > maxListed {
		return strings.Join(ids[:maxListed], ", ") + fmt.Sprintf(" … (%d in all)", len(ids))
	}
	return strings.Join(ids, ", ")
}

// Check asserts the run's guarantees from the database (pool's search_path
// is the run's schema) and from what the runner observed: exactly one
// ledger entry and one payments row per order, with the published amount;
// nothing for poison or declined messages; one created charge per order
// carrying the key "payment:<order_id>"; every poison and declined message
// in the dead-letter queue with its x-error; nothing else dead-lettered;
// nothing left in the work or retry queues.
func Check(ctx context.Context, pool *pgxpool.Pool, exp Expect, obs Observed) (*Result, error) {
	res := &Result{}
	want := make(map[string]Order, len(exp.Orders))
	for _, o := range exp.Orders {
		want[o.ID] = o
	}
	declined := make(map[string]bool, len(exp.Declined))
	for _, o := range exp.Declined {
		declined[o.ID] = true
	}

	// Ledger: exactly one entry per order, none for anything else.
	ledger := make(map[string]int)
	rows, err := pool.Query(ctx, `SELECT order_id, count(*), min(amount_cents), max(amount_cents) FROM ledger_entries GROUP BY order_id`)
	if err != nil {
		return nil, fmt.Errorf("chaos: read ledger: %w", err)
	}
	var wrongAmount []string
	for rows.Next() {
		var id string
		var n int
		var lo, hi int64
		if err := rows.Scan(&id, &n, &lo, &hi); err != nil {
			rows.Close()
			return nil, fmt.Errorf("chaos: read ledger: %w", err)
		}
		ledger[id] = n
		res.LedgerEntries += n
		if o, ok := want[id]; ok && (lo != o.AmountCents || hi != o.AmountCents) {
			wrongAmount = append(wrongAmount, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chaos: read ledger: %w", err)
	}

	payments := make(map[string]bool)
	rows, err = pool.Query(ctx, `SELECT order_id, amount_cents, trim(currency) FROM payments`)
	if err != nil {
		return nil, fmt.Errorf("chaos: read payments: %w", err)
	}
	for rows.Next() {
		var id, cur string
		var amount int64
		if err := rows.Scan(&id, &amount, &cur); err != nil {
			rows.Close()
			return nil, fmt.Errorf("chaos: read payments: %w", err)
		}
		payments[id] = true
		res.Payments++
		if o, ok := want[id]; ok && (amount != o.AmountCents || !strings.EqualFold(cur, o.Currency)) {
			wrongAmount = append(wrongAmount, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chaos: read payments: %w", err)
	}

	var missing, dupLedger, noPayment, unexpected []string
	for id := range want {
		switch n := ledger[id]; {
		case n == 0:
			missing = append(missing, id)
		case n > 1:
			dupLedger = append(dupLedger, fmt.Sprintf("%s×%d", id, n))
		}
		if !payments[id] {
			noPayment = append(noPayment, id)
		}
	}
	for id := range ledger {
		if _, ok := want[id]; !ok {
			unexpected = append(unexpected, id)
		}
	}
	for id := range payments {
		if _, ok := want[id]; !ok && !slices.Contains(unexpected, id) {
			unexpected = append(unexpected, id)
		}
	}
	if len(dupLedger) > 0 {
		res.violate("duplicate effect: %d orders have more than one ledger entry: %s", len(dupLedger), listed(dupLedger))
	}
	if len(missing) > 0 {
		res.violate("lost effect: %d orders have no ledger entry: %s", len(missing), listed(missing))
	}
	if len(noPayment) > 0 {
		res.violate("lost effect: %d orders have no payments row: %s", len(noPayment), listed(noPayment))
	}
	if len(unexpected) > 0 {
		res.violate("unexpected effect: %d rows for orders that must write nothing: %s", len(unexpected), listed(unexpected))
	}
	if len(wrongAmount) > 0 {
		res.violate("wrong effect: %d rows differ from the published order: %s", len(wrongAmount), listed(wrongAmount))
	}

	if obs.Gateway {
		checkGateway(res, want, declined, obs.Calls)
	}
	checkDeadLetters(res, exp, obs.DeadLetters, want)
	var left []string
	for q, n := range obs.Leftover {
		if n > 0 {
			left = append(left, fmt.Sprintf("%s=%d", q, n))
		}
	}
	if len(left) > 0 {
		res.violate("not drained: messages left after every worker stopped: %s", listed(left))
	}
	return res, nil
}

func checkGateway(res *Result, want map[string]Order, declined map[string]bool, calls []Charge) {
	created := make(map[string]int) // by order id
	perKey := make(map[string]int)  // calls by key
	var badKey, conflict []string
	for _, c := range calls {
		res.GatewayCalls++
		perKey[c.Key]++
		if c.Key != "payment:"+c.OrderID {
			badKey = append(badKey, fmt.Sprintf("%s(key %q)", c.OrderID, c.Key))
		}
		if c.Status == 422 {
			conflict = append(conflict, c.OrderID)
		}
		if c.Created {
			created[c.OrderID]++
			res.ChargesCreated++
		}
	}
	for k, n := range perKey {
		if n > 1 && !declined[strings.TrimPrefix(k, "payment:")] {
			res.ExtraCalls += n - 1
		}
	}
	var uncharged, twice, chargedDeclined []string
	for id := range want {
		switch n := created[id]; {
		case n == 0:
			uncharged = append(uncharged, id)
		case n > 1:
			twice = append(twice, fmt.Sprintf("%s×%d", id, n))
		}
	}
	for id := range declined {
		if created[id] > 0 {
			chargedDeclined = append(chargedDeclined, id)
		}
	}
	if len(twice) > 0 {
		res.violate("duplicate charge: %d orders were charged more than once: %s", len(twice), listed(twice))
	}
	if len(uncharged) > 0 {
		res.violate("lost charge: %d orders were never charged: %s", len(uncharged), listed(uncharged))
	}
	if len(chargedDeclined) > 0 {
		res.violate("declined orders charged: %s", listed(chargedDeclined))
	}
	if len(badKey) > 0 {
		res.violate("unstable idempotency key: %d gateway calls carried a key other than payment:<order_id>: %s", len(badKey), listed(badKey))
	}
	if len(conflict) > 0 {
		res.violate("key reused with a different body: %s", listed(conflict))
	}
}

func checkDeadLetters(res *Result, exp Expect, dls []DeadLetter, want map[string]Order) {
	type slot struct {
		name  string
		found int
	}
	expected := make(map[string]*slot)
	for i, p := range exp.Poison {
		expected[string(p)] = &slot{name: fmt.Sprintf("poison #%d %.40q", i+1, p)}
	}
	var noReason, unexpected []string
	for _, dl := range dls {
		s, ok := expected[string(dl.Body)]
		if !ok {
			// A declined order is matched by its order id (its body is JSON).
			for _, o := range exp.Declined {
				if strings.Contains(string(dl.Body), `"`+o.ID+`"`) {
					s = expected["declined:"+o.ID]
					if s == nil {
						s = &slot{name: "declined " + o.ID}
						expected["declined:"+o.ID] = s
					}
					ok = true
					break
				}
			}
		}
		if !ok {
			name := fmt.Sprintf("%.60q", dl.Body)
			for id := range want {
				if strings.Contains(string(dl.Body), `"`+id+`"`) {
					name = id + " (" + dl.Error + ")"
				}
			}
			unexpected = append(unexpected, name)
			continue
		}
		s.found++
		if dl.Error == "" {
			noReason = append(noReason, s.name)
		}
	}
	for _, o := range exp.Declined {
		if expected["declined:"+o.ID] == nil {
			expected["declined:"+o.ID] = &slot{name: "declined " + o.ID}
		}
	}
	var absent []string
	for _, s := range expected {
		if s.found == 0 {
			absent = append(absent, s.name)
		}
	}
	if len(absent) > 0 {
		res.violate("missing dead letter: %d poison or declined messages are not in the DLQ: %s", len(absent), listed(absent))
	}
	if len(noReason) > 0 {
		res.violate("dead letter without x-error: %s", listed(noReason))
	}
	if len(unexpected) > 0 {
		res.violate("unexpected dead letter: %d valid messages were dead-lettered: %s", len(unexpected), listed(unexpected))
	}
}
