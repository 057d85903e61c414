package chaos

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// Charge is one call the fake gateway received.
type Charge struct {
	// Key is the Idempotency-Key header.
	Key string
	// OrderID, AmountCents and Currency are the JSON body's fields.
	OrderID     string
	AmountCents int64
	Currency    string
	// Status is the HTTP status the gateway answered.
	Status int
	// Created is true for the call that created the charge (the first 2xx
	// for its key); a later 2xx for the same key is a replay.
	Created bool
	// At is when the call arrived.
	At time.Time
}

// GatewayPhase is how the fake gateway behaves for a while. The zero value
// is a healthy gateway.
type GatewayPhase struct {
	// Delay is added before answering each call. Zero means no delay.
	Delay time.Duration
	// FailRate is the probability (0..1) that a call is answered 503 before
	// anything is charged. Zero means never.
	FailRate float64
	// LostReplyRate is the probability (0..1) that a call is charged but
	// answered 500, as when the gateway's reply is lost after it acted.
	// Zero means never.
	LostReplyRate float64
}

// Gateway is a recording fake payment gateway: an httptest server that
// behaves like an idempotent real one. The first successful call for an
// Idempotency-Key creates the charge; later calls with that key are answered
// with the same result and never charge again; a key reused with a different
// body is answered 422. Orders whose id ends in "-declined" are answered 402
// (a permanent failure). Every call is recorded.
type Gateway struct {
	srv *httptest.Server

	mu       sync.Mutex
	calls    []Charge
	created  map[string]Charge // by key
	phase    GatewayPhase
	phaseEnd time.Time
	rnd      *rand.Rand
}

// NewGateway starts a fake gateway on a loopback port. seed drives its
// random failures. Close it when done.
func NewGateway(seed uint64) *Gateway {
	g := &Gateway{created: make(map[string]Charge), rnd: rand.New(rand.NewPCG(seed, 0x9a7e))}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	return g
}

// URL is the gateway's base URL (charges go to URL + "/charges").
func (g *Gateway) URL() string { return g.srv.URL }

// Close stops the server.
func (g *Gateway) Close() {
	g.srv.CloseClientConnections()
	g.srv.Close()
}

// SetPhase makes the gateway behave as p until d has passed (then it is
// healthy again). A zero d sets p until the next SetPhase.
func (g *Gateway) SetPhase(p GatewayPhase, d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.phase = p
	g.phaseEnd = time.Time{}
	if d > 0 {
		g.phaseEnd = time.Now().Add(d)
	}
}

// Calls returns every call received so far, in arrival order.
func (g *Gateway) Calls() []Charge {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Charge(nil), g.calls...)
}

type chargeBody struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/charges" {
		http.NotFound(w, r)
		return
	}
	var b chargeBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return
	}
	c := Charge{Key: r.Header.Get("Idempotency-Key"), OrderID: b.OrderID, AmountCents: b.AmountCents, Currency: b.Currency, At: time.Now()}

	g.mu.Lock()
	phase := g.phase
	if !g.phaseEnd.IsZero() && time.Now().After(g.phaseEnd) {
		phase, g.phase, g.phaseEnd = GatewayPhase{}, GatewayPhase{}, time.Time{}
	}
	fail := g.rnd.Float64() < phase.FailRate
	lost := g.rnd.Float64() < phase.LostReplyRate
	g.mu.Unlock()

	if phase.Delay > 0 {
		t := time.NewTimer(phase.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	switch prev, seen := g.created[c.Key]; {
	case c.Key == "":
		c.Status = http.StatusBadRequest
	case seen && (prev.OrderID != c.OrderID || prev.AmountCents != c.AmountCents || prev.Currency != c.Currency):
		c.Status = http.StatusUnprocessableEntity
	case seen:
		c.Status = http.StatusOK // replay of the stored result
	case fail:
		c.Status = http.StatusServiceUnavailable
	case strings.HasSuffix(c.OrderID, "-declined"):
		c.Status = http.StatusPaymentRequired
	default:
		c.Created = true
		g.created[c.Key] = c
		c.Status = http.StatusCreated
		if lost {
			c.Status = http.StatusInternalServerError
		}
	}
	g.calls = append(g.calls, c)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(c.Status)
	_ = json.NewEncoder(w).Encode(map[string]any{"key": c.Key, "status": c.Status})
}
