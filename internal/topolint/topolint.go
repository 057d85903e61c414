// Package topolint reads a route's queues, their arguments and the
// policies that apply to them from RabbitMQ's management API, and flags
// what silently loses or loops messages: a queue without a dead-letter
// target, a delivery limit at or below the route's attempts, a TTL or a
// length limit with nowhere to dead-letter, quorum dead-lettering at most
// once, a consumer timeout shorter than a route's longest run, a policy
// that sets what the worker's own arguments decide. inboxctl lint and the
// worker's start-up check both use it.
package topolint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Severities of a [Finding].
const (
	// Error is a setting that loses or loops messages: fix it before
	// running the route.
	Error = "error"
	// Warning is a setting that changes what the worker decided without
	// losing messages today.
	Warning = "warning"
)

// Finding is one problem of one queue.
type Finding struct {
	Severity string `json:"severity"`
	Queue    string `json:"queue"`
	// Rule names the check: no-dead-letter-target, delivery-limit,
	// ttl-without-dead-letter, expires, at-most-once, overflow,
	// length-limit, consumer-timeout, policy-override, missing.
	Rule    string `json:"rule"`
	Message string `json:"message"`
}

// Queue is one queue of a route's topology, as the worker declares it.
type Queue struct {
	// Name is the queue's name.
	Name string
	// Role is what the queue is to the route: "work", "dead" (the broker's
	// dead letters, filed by the worker), "retry" (a delay tier), "dlq".
	Role string
	// Args are the arguments the worker declares it with.
	Args map[string]any
	// Consumed says whether a worker consumes the queue (work and dead):
	// only those are subject to a consumer timeout.
	Consumed bool
}

// Route is what the lint needs of one route.
type Route struct {
	// Queues are the route's queues.
	Queues []Queue
	// Attempts is the route's retry budget (0: unknown, not checked).
	Attempts int
	// LongestRun is the longest a delivery may be held (the handler
	// timeout; 0: unbounded, checked against no consumer timeout).
	LongestRun time.Duration
}

// API reads RabbitMQ's management API.
type API struct {
	base   *url.URL
	user   string
	pass   string
	client *http.Client
}

// NewAPI returns a client of the management API at rawURL
// ("http://user:pass@host:15672"); without credentials in rawURL, user and
// pass are used.
func NewAPI(rawURL, user, pass string) (*API, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("topolint: management URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("topolint: management URL %q: want http or https", u.Redacted())
	}
	if u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
		u.User = nil
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return &API{base: u, user: user, pass: pass, client: &http.Client{Timeout: 10 * time.Second}}, nil
}

// ManagementURL derives the management API's URL from a broker URL
// (amqp://user:pass@host:5672/vhost → http://user:pass@host:15672, and
// amqps → https on 15671) and returns the vhost too.
func ManagementURL(amqpURL string) (mgmt, vhost string, err error) {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return "", "", fmt.Errorf("topolint: broker URL: %w", err)
	}
	scheme, port := "http", "15672"
	if u.Scheme == "amqps" {
		scheme, port = "https", "15671"
	}
	vhost = strings.TrimPrefix(u.Path, "/")
	if vhost == "" {
		vhost = "/"
	}
	vhost, err = url.PathUnescape(vhost)
	if err != nil {
		return "", "", fmt.Errorf("topolint: broker URL vhost: %w", err)
	}
	m := url.URL{Scheme: scheme, Host: u.Hostname() + ":" + port, User: u.User}
	if u.User == nil {
		m.User = url.UserPassword("guest", "guest")
	}
	return m.String(), vhost, nil
}

// errNotFound is a 404 of the API.
var errNotFound = errors.New("not found")

func (a *API) get(ctx context.Context, path string, out any) error {
	u := *a.base
	u.RawPath = a.base.Path + path
	u.Path = a.base.Path + mustUnescape(path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth(a.user, a.pass)
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("topolint: the management API at %s does not answer (is the rabbitmq_management plugin enabled? rabbitmq-plugins enable rabbitmq_management; or give its URL): %w",
			a.base.Redacted(), err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return errNotFound
	case resp.StatusCode != http.StatusOK:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("topolint: management API GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("topolint: management API GET %s: %w", path, err)
	}
	return nil
}

func mustUnescape(p string) string {
	s, err := url.PathUnescape(p)
	if err != nil {
		return p
	}
	return s
}

// queueInfo is what the API says of a queue.
type queueInfo struct {
	Type            string         `json:"type"`
	Arguments       map[string]any `json:"arguments"`
	Policy          *string        `json:"policy"`
	OperatorPolicy  *string        `json:"operator_policy"`
	EffectivePolicy map[string]any `json:"effective_policy_definition"`
}

// Lint reads the queues of routes in vhost and returns what it finds,
// errors first. err is only for an API that cannot be read.
func Lint(ctx context.Context, api *API, vhost string, routes []Route) ([]Finding, error) {
	var out []Finding
	for _, rt := range routes {
		for _, q := range rt.Queues {
			var info queueInfo
			err := api.get(ctx, "/api/queues/"+url.PathEscape(vhost)+"/"+url.PathEscape(q.Name), &info)
			if errors.Is(err, errNotFound) {
				out = append(out, Finding{Warning, q.Name, "missing", "the queue is not declared (yet): the worker declares it at start-up, unless the route says NoDeclare"})
				continue
			}
			if err != nil {
				return nil, err
			}
			out = append(out, Check(rt, q, info.Arguments, info.EffectivePolicy, policyName(info))...)
		}
	}
	slices.SortStableFunc(out, func(a, b Finding) int {
		if a.Severity == b.Severity {
			return 0
		}
		if a.Severity == Error {
			return -1
		}
		return 1
	})
	return out, nil
}

func policyName(info queueInfo) string {
	var names []string
	if info.Policy != nil && *info.Policy != "" {
		names = append(names, "policy "+*info.Policy)
	}
	if info.OperatorPolicy != nil && *info.OperatorPolicy != "" {
		names = append(names, "operator policy "+*info.OperatorPolicy)
	}
	if len(names) == 0 {
		return "a policy"
	}
	return strings.Join(names, " and ")
}

// policyKeys maps the keys of a policy definition to the queue arguments
// they stand for.
var policyKeys = map[string]string{
	"dead-letter-exchange":    "x-dead-letter-exchange",
	"dead-letter-routing-key": "x-dead-letter-routing-key",
	"dead-letter-strategy":    "x-dead-letter-strategy",
	"overflow":                "x-overflow",
	"delivery-limit":          "x-delivery-limit",
	"message-ttl":             "x-message-ttl",
	"expires":                 "x-expires",
	"max-length":              "x-max-length",
	"max-length-bytes":        "x-max-length-bytes",
	"consumer-timeout":        "x-consumer-timeout",
}

// limits are the keys of which the lowest value applies, whichever sets
// it (arguments, policy, operator policy).
var limits = map[string]bool{
	"x-delivery-limit": true, "x-message-ttl": true, "x-expires": true,
	"x-max-length": true, "x-max-length-bytes": true, "x-consumer-timeout": true,
}

// Check lints one queue from its arguments on the broker (args), the
// definition of the policies that apply to it (policy, may be nil) and
// their names (for the messages).
func Check(rt Route, q Queue, args, policy map[string]any, policyNames string) []Finding {
	var out []Finding
	add := func(sev, rule, format string, a ...any) {
		out = append(out, Finding{Severity: sev, Queue: q.Name, Rule: rule, Message: fmt.Sprintf(format, a...)})
	}
	// The effective settings: an argument wins over a policy, except for
	// limits, where the lowest applies.
	eff := map[string]any{}
	for k, v := range args {
		eff[k] = v
	}
	for pk, v := range policy {
		ak, ok := policyKeys[pk]
		if !ok {
			continue
		}
		cur, set := eff[ak]
		switch {
		case !set:
			eff[ak] = v
		case limits[ak]:
			if n, ok := number(v); ok {
				if c, ok := number(cur); !ok || n < c {
					eff[ak] = v
				}
			}
		}
		if want, declared := q.Args[ak]; declared && !equal(want, eff[ak]) {
			add(Warning, "policy-override", "%s sets %s to %v where the worker declares %s = %v", policyNames, pk, v, ak, want)
		} else if !declared && (ak == "x-dead-letter-exchange" || ak == "x-dead-letter-routing-key" || ak == "x-overflow" || ak == "x-dead-letter-strategy") {
			add(Warning, "policy-override", "%s sets %s to %v, which the worker does not declare", policyNames, pk, v)
		}
	}
	for ak, want := range q.Args {
		if ak == "x-queue-type" {
			continue
		}
		if got, ok := args[ak]; ok && !equal(want, got) {
			add(Warning, "policy-override", "declared with %s = %v on the broker, the worker declares %v (declared by someone else, or by another version)", ak, got, want)
		}
	}

	quorum := fmt.Sprint(args["x-queue-type"]) == "quorum"
	_, hasDLX := eff["x-dead-letter-exchange"]
	if q.Role != "dlq" && !hasDLX {
		add(Error, "no-dead-letter-target", "no dead-letter target (x-dead-letter-exchange): a message the broker expires, drops for a limit or counts past its delivery limit is lost")
	}
	if _, ok := eff["x-expires"]; ok {
		add(Error, "expires", "the queue expires (x-expires): when it does, its messages go with it")
	}
	if ttl, ok := number(eff["x-message-ttl"]); ok && !hasDLX {
		add(Error, "ttl-without-dead-letter", "messages expire after %s with no dead-letter target: they are dropped", time.Duration(ttl)*time.Millisecond)
	} else if ok && q.Role == "dlq" {
		add(Error, "ttl-without-dead-letter", "the dead-letter queue expires its messages after %s", time.Duration(ttl)*time.Millisecond)
	}
	for _, k := range []string{"x-max-length", "x-max-length-bytes"} {
		if n, ok := number(eff[k]); ok {
			overflow := fmt.Sprint(eff["x-overflow"])
			switch {
			case q.Role == "dlq" && overflow != "reject-publish":
				add(Error, "length-limit", "%s %d drops dead letters from the head of the dead-letter queue", k, n)
			case !hasDLX && overflow != "reject-publish" && overflow != "reject-publish-dlx":
				add(Error, "length-limit", "%s %d drops messages from the head with no dead-letter target", k, n)
			}
		}
	}
	if quorum && hasDLX && q.Role != "dlq" {
		if s := fmt.Sprint(eff["x-dead-letter-strategy"]); s != "at-least-once" {
			add(Error, "at-most-once", "a quorum queue dead-letters at most once (x-dead-letter-strategy is %q): a dead letter is lost if its target does not take it", strategyOr(s))
		} else if o := fmt.Sprint(eff["x-overflow"]); o != "reject-publish" {
			add(Error, "overflow", "at-least-once dead-lettering needs x-overflow reject-publish (it is %q): RabbitMQ falls back to at most once", o)
		}
	}
	if n, ok := number(eff["x-delivery-limit"]); ok && quorum && q.Role == "work" && rt.Attempts > 0 && n <= int64(rt.Attempts) {
		add(Error, "delivery-limit", "the delivery limit %d is at or below the route's %d attempts: the broker dead-letters a message before the route has spent them (crashes and requeues count too)", n, rt.Attempts)
	}
	if n, ok := number(eff["x-consumer-timeout"]); ok && q.Consumed {
		to := time.Duration(n) * time.Millisecond
		if rt.LongestRun <= 0 || to <= rt.LongestRun {
			add(Error, "consumer-timeout", "a consumer timeout of %s closes the channel of a delivery held longer, with every delivery on it, while the route may run a delivery for %s", to, runOr(rt.LongestRun))
		}
	}
	return out
}

func strategyOr(s string) string {
	if s == "<nil>" || s == "" {
		return "at-most-once, the default"
	}
	return s
}

func runOr(d time.Duration) string {
	if d <= 0 {
		return "ever (no handler timeout)"
	}
	return d.String()
}

// number reads a JSON or AMQP number.
func number(v any) (int64, bool) {
	switch n := v.(type) {
	case float64:
		if n > math.MaxInt64 || n < math.MinInt64 {
			return 0, false
		}
		return int64(n), true
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case int:
		return int64(n), true
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	}
	return 0, false
}

func equal(a, b any) bool {
	if x, ok := number(a); ok {
		y, ok := number(b)
		return ok && x == y
	}
	return fmt.Sprint(a) == fmt.Sprint(b)
}
