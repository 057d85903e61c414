package amqpdial

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
)

// Node is one broker node of a list: its URL (credentials included) and
// its address, host:port, which names it in logs and metric labels.
type Node struct {
	// URL is the node's amqp:// or amqps:// URL as given.
	URL string
	// Addr is the node's host:port (port 5672, or 5671 for amqps://, when
	// the URL names none).
	Addr string
}

// Redacted returns the node's URL with its password replaced by "xxxxx".
func (n Node) Redacted() string { return redactOne(n.URL) }

// schemeStart matches the start of a URL: a scheme and "://".
var schemeStart = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// split cuts list at every comma that ends an entry: one followed, after
// optional spaces, by a scheme ("amqp://", or any other, so that a wrong
// one is reported), by another comma or by nothing. A comma elsewhere (in a
// password, say) is part of the URL it is in. Entries are trimmed.
func split(list string) []string {
	var out []string
	start := 0
	for i := 0; i < len(list); i++ {
		if list[i] != ',' {
			continue
		}
		rest := strings.TrimLeft(list[i+1:], " \t")
		if rest == "" || rest[0] == ',' || schemeStart.MatchString(rest) {
			out = append(out, strings.TrimSpace(list[start:i]))
			start = i + 1
		}
	}
	return append(out, strings.TrimSpace(list[start:]))
}

// Parse parses a broker address: one amqp:// or amqps:// URL, or several
// separated by commas (the nodes of a cluster). Every entry must be a full
// URL with a host. The error names the bad entry by position, its password
// redacted; it never wraps url.Parse's error, which echoes the input.
func Parse(list string) ([]Node, error) {
	if strings.TrimSpace(list) == "" {
		return nil, errors.New("no broker URL")
	}
	entries := split(list)
	nodes := make([]Node, 0, len(entries))
	seen := make(map[string]bool, len(entries))
	for i, raw := range entries {
		n, err := parseOne(raw)
		if err != nil {
			if len(entries) == 1 {
				return nil, fmt.Errorf("broker URL %q %s", redactOne(raw), err.Error())
			}
			return nil, fmt.Errorf("broker URL %d of %d (%q) %s", i+1, len(entries), redactOne(raw), err.Error())
		}
		if seen[n.URL] {
			return nil, fmt.Errorf("broker URL %q is listed twice", n.Redacted())
		}
		seen[n.URL] = true
		nodes = append(nodes, n)
	}
	return nodes, nil
}

func parseOne(raw string) (Node, error) {
	if raw == "" {
		return Node{}, errors.New("is empty (a stray comma?)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Node{}, errors.New("is not a valid URL")
	}
	var port string
	switch strings.ToLower(u.Scheme) {
	case "amqp":
		port = "5672"
	case "amqps":
		port = "5671"
	default:
		return Node{}, errors.New("must use amqp:// or amqps://")
	}
	host := u.Hostname()
	if host == "" {
		return Node{}, errors.New("has no host")
	}
	if strings.ContainsAny(u.Host, ", ") {
		return Node{}, errors.New("has a list of hosts: give every node as a full amqp:// URL, separated by commas")
	}
	if strings.ContainsAny(u.EscapedPath()+u.RawQuery+u.EscapedFragment(), ",@") {
		// A node whose scheme is mistyped ("amqp//…") is not split off
		// and ends up in the path of the entry before it.
		return Node{}, errors.New("has a comma or @ after its host: give every node as a full amqp:// URL, separated by commas")
	}
	if p := u.Port(); p != "" {
		port = p
	}
	return Node{URL: raw, Addr: net.JoinHostPort(host, port)}, nil
}

// Redact returns a broker address (one URL or a comma-separated list) with
// every password replaced by "xxxxx", so it can be logged or put into an
// error. An entry that does not parse as a URL becomes "<unparseable url>",
// because it may still contain a secret.
func Redact(list string) string {
	entries := split(list)
	for i, e := range entries {
		entries[i] = redactOne(e)
	}
	return strings.Join(entries, ",")
}

func redactOne(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparseable url>"
	}
	if strings.Contains(u.EscapedPath()+u.RawQuery+u.EscapedFragment()+u.Opaque, "@") {
		// Credentials past the host (a mistyped second URL swallowed by
		// the first): keep only what is known to be safe.
		u.Path, u.RawPath, u.RawQuery, u.Fragment, u.Opaque = "", "", "", "", ""
		return u.Redacted() + "/<hidden>"
	}
	return u.Redacted()
}

// redactErr removes the passwords of nodes from err's text, should a
// library ever echo one. It keeps err (for errors.Is) when there is
// nothing to remove.
func redactErr(nodes []Node, err error) error {
	msg := err.Error()
	out := msg
	for _, n := range nodes {
		u, perr := url.Parse(n.URL)
		if perr != nil || u.User == nil {
			continue
		}
		if pw, ok := u.User.Password(); ok && pw != "" {
			out = strings.ReplaceAll(out, pw, "xxxxx")
		}
	}
	if out == msg {
		return err
	}
	return errors.New(out)
}
