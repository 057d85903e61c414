package inboxmq

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisOpts adjust the client [RedisFromURL] builds. A nil *RedisOpts
// keeps what the URL says, else go-redis's defaults.
type RedisOpts struct {
	// DialTimeout, ReadTimeout and WriteTimeout, when positive, replace the
	// URL's dial_timeout, read_timeout and write_timeout. Defaults to 0:
	// the URL's, else go-redis's defaults.
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
}

// RedisFromURL builds the Redis client of [Config.Redis] from a URL, for a
// single server, a Sentinel-managed primary or a Redis Cluster:
//
//	redis://[user:password@]host[:6379][/db][?options]
//	rediss://…                                   (TLS)
//	redis+sentinel://[user:password@]host1[:26379],host2[:26379]/master[/db][?options]
//	rediss+sentinel://…                          (TLS to the Sentinels and to the data nodes)
//	redis+cluster://[user:password@]host1[:6379],host2[:6379][?options]
//	rediss+cluster://…                           (TLS to every node)
//
// The user and password are those of the data nodes (the primary and its
// replicas, or the cluster's nodes). Sentinels that require a password
// take the sentinel_username and sentinel_password options. Sentinel URLs
// name the master set as the first path segment, and may name the
// database as the second one or with db=N; a cluster has only database 0.
// The other options are go-redis's own (dial_timeout, read_timeout,
// write_timeout, pool_size, client_name, max_retries, protocol,
// skip_verify, …, as its ParseURL, ParseFailoverURL and ParseClusterURL
// accept them); an unknown option is an error. With TLS the server name
// checked is the host of each address dialled.
//
// The client has ContextTimeoutEnabled set, so the lock's and the cache's
// call timeouts bound socket reads as well. It does not connect until
// first used. A bad URL is an error that shows the URL with its passwords
// masked; credentials never appear in errors.
func RedisFromURL(rawURL string, opts *RedisOpts) (redis.UniversalClient, error) {
	t, err := parseRedisURL(rawURL)
	if err != nil {
		return nil, err
	}
	t.apply(opts)
	switch {
	case t.failover != nil:
		return redis.NewFailoverClient(t.failover), nil
	case t.cluster != nil:
		return redis.NewClusterClient(t.cluster), nil
	default:
		return redis.NewClient(t.single), nil
	}
}

// redisTarget is a parsed Redis URL: exactly one of its fields is set.
type redisTarget struct {
	single   *redis.Options
	failover *redis.FailoverOptions
	cluster  *redis.ClusterOptions
}

// apply sets ContextTimeoutEnabled and opts' overrides.
func (t redisTarget) apply(opts *RedisOpts) {
	var o RedisOpts
	if opts != nil {
		o = *opts
	}
	set := func(dst *time.Duration, v time.Duration) {
		if v > 0 {
			*dst = v
		}
	}
	switch {
	case t.failover != nil:
		t.failover.ContextTimeoutEnabled = true
		set(&t.failover.DialTimeout, o.DialTimeout)
		set(&t.failover.ReadTimeout, o.ReadTimeout)
		set(&t.failover.WriteTimeout, o.WriteTimeout)
	case t.cluster != nil:
		t.cluster.ContextTimeoutEnabled = true
		set(&t.cluster.DialTimeout, o.DialTimeout)
		set(&t.cluster.ReadTimeout, o.ReadTimeout)
		set(&t.cluster.WriteTimeout, o.WriteTimeout)
	default:
		t.single.ContextTimeoutEnabled = true
		set(&t.single.DialTimeout, o.DialTimeout)
		set(&t.single.ReadTimeout, o.ReadTimeout)
		set(&t.single.WriteTimeout, o.WriteTimeout)
	}
}

const (
	defaultSentinelPort = "26379"
	defaultRedisPort    = "6379"
)

// parseRedisURL parses the URL forms of RedisFromURL. Its errors carry the
// URL with passwords masked, never go-redis's or net/url's own text of it.
func parseRedisURL(rawURL string) (redisTarget, error) {
	secrets := urlSecrets(rawURL)
	fail := func(format string, args ...any) (redisTarget, error) {
		msg := fmt.Sprintf(format, args...)
		for _, s := range secrets {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
		return redisTarget{}, fmt.Errorf("inboxmq: redis url %s: %s", redactRedisURL(rawURL), msg)
	}
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return fail("want redis://, rediss://, redis+sentinel://, rediss+sentinel://, redis+cluster:// or rediss+cluster://")
	}
	base, mode, _ := strings.Cut(strings.ToLower(scheme), "+")
	if base != "redis" && base != "rediss" {
		return fail("unknown scheme %q: want redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", scheme)
	}
	switch mode {
	case "":
		if base == "redis" && strings.Contains(rest, "addr=") {
			return fail("a cluster or several addresses: use redis+cluster://host1,host2 (or redis+sentinel://)")
		}
		o, err := redis.ParseURL(rawURL)
		if err != nil {
			return fail("%s", goRedisError(err))
		}
		return redisTarget{single: o}, nil
	case "sentinel", "cluster":
	default:
		return fail("unknown scheme %q: want redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", scheme)
	}

	// authority, path and query of a multi-host URL, split by hand:
	// net/url takes one host only.
	authority, pathQuery := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, pathQuery = rest[:i], rest[i:]
	}
	if strings.Contains(pathQuery, "#") {
		return fail("a fragment (#…) is not allowed")
	}
	path, rawQuery, _ := strings.Cut(pathQuery, "?")
	var user *url.Userinfo
	hostList := authority
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		u, err := url.Parse("redis://" + authority[:i+1] + "h")
		if err != nil || u.User == nil {
			return fail("invalid user information (percent-encode reserved characters in the password)")
		}
		user, hostList = u.User, authority[i+1:]
	}
	defPort := defaultRedisPort
	if mode == "sentinel" {
		defPort = defaultSentinelPort
	}
	addrs, err := splitHosts(hostList, defPort)
	if err != nil {
		return fail("%s", err.Error())
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return fail("invalid query")
	}
	for _, k := range []string{"addr", "master_name", "username", "password"} {
		if q.Has(k) {
			return fail("option %s is not allowed here: put addresses in the host list, the master in the path and the credentials before the @", k)
		}
	}
	sentinelUser, sentinelPass := q.Get("sentinel_username"), q.Get("sentinel_password")
	q.Del("sentinel_username")
	q.Del("sentinel_password")
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}

	segs := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
	if mode == "cluster" {
		if sentinelUser != "" || sentinelPass != "" {
			return fail("sentinel_username and sentinel_password are for redis+sentinel:// URLs")
		}
		if len(segs) > 0 || q.Has("db") {
			return fail("a Redis Cluster has only database 0: remove the path and db")
		}
		o, err := redis.ParseClusterURL(base + "://" + addrs[0] + "?" + q.Encode())
		if err != nil {
			return fail("%s", goRedisError(err))
		}
		setUser(user, &o.Username, &o.Password)
		tlsPerAddress(o.TLSConfig)
		return redisTarget{cluster: o}, nil
	}

	if len(segs) == 0 || len(segs) > 2 {
		return fail("want the master set's name as the path: redis+sentinel://host1,host2/mymaster[/db]")
	}
	master, err := url.PathUnescape(segs[0])
	if err != nil || master == "" {
		return fail("invalid master name")
	}
	if len(segs) == 2 {
		if q.Has("db") {
			return fail("the database is named twice (path and db)")
		}
		if _, err := strconv.Atoi(segs[1]); err != nil {
			return fail("invalid database number %q", segs[1])
		}
		q.Set("db", segs[1])
	}
	q.Set("master_name", master)
	o, err := redis.ParseFailoverURL(base + "://" + addrs[0] + "?" + q.Encode())
	if err != nil {
		return fail("%s", goRedisError(err))
	}
	o.SentinelUsername, o.SentinelPassword = sentinelUser, sentinelPass
	setUser(user, &o.Username, &o.Password)
	tlsPerAddress(o.TLSConfig)
	return redisTarget{failover: o}, nil
}

// splitHosts splits "h1[:p1],h2[:p2]" into host:port addresses.
func splitHosts(list, defPort string) ([]string, error) {
	if list == "" {
		return nil, errors.New("no host")
	}
	var out []string
	for h := range strings.SplitSeq(list, ",") {
		if h == "" {
			return nil, errors.New("an empty host in the host list")
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil { // no port
			host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), defPort
			if strings.ContainsAny(host, "[]") || (strings.Contains(host, ":") && !strings.HasPrefix(h, "[")) {
				return nil, fmt.Errorf("invalid host %q", h)
			}
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("invalid port in %q", h)
		}
		if host == "" {
			return nil, fmt.Errorf("invalid host %q", h)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	return out, nil
}

func setUser(u *url.Userinfo, name, password *string) {
	if u == nil {
		return
	}
	*name = u.Username()
	if p, ok := u.Password(); ok {
		*password = p
	}
}

// tlsPerAddress lets crypto/tls check each dialled address's own host name:
// go-redis's parsers pin the first host's, which the other Sentinels, the
// data nodes a Sentinel names and the other cluster nodes do not carry.
func tlsPerAddress(c *tls.Config) {
	if c != nil {
		c.ServerName = ""
		c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	}
}

// goRedisError is the text of a go-redis parser error, without the URL
// that net/url's errors quote.
func goRedisError(err error) string {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return "not a valid URL"
	}
	return strings.TrimPrefix(err.Error(), "redis: ")
}

// urlSecrets returns the passwords in rawURL (userinfo, password and
// sentinel_password options), raw and decoded, to scrub from messages.
func urlSecrets(rawURL string) []string {
	var out []string
	add := func(s string) {
		if s != "" {
			out = append(out, s)
			if d, err := url.QueryUnescape(s); err == nil && d != s {
				out = append(out, d)
			}
		}
	}
	if _, rest, ok := strings.Cut(rawURL, "://"); ok {
		authority := rest
		if i := strings.IndexAny(rest, "/?#"); i >= 0 {
			authority = rest[:i]
		}
		if i := strings.LastIndexByte(authority, '@'); i >= 0 {
			if _, pass, ok := strings.Cut(authority[:i], ":"); ok {
				add(pass)
			}
		}
	}
	if _, rawQuery, ok := strings.Cut(rawURL, "?"); ok {
		for kv := range strings.SplitSeq(rawQuery, "&") {
			k, v, _ := strings.Cut(kv, "=")
			if k == "password" || k == "sentinel_password" {
				add(v)
			}
		}
	}
	return out
}

// redactRedisURL returns rawURL, one of [RedisFromURL]'s forms, with the
// passwords (of the userinfo, and the password and sentinel_password
// options) replaced by "xxxxx", for logs and errors.
func redactRedisURL(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return "<not a redis url>"
	}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		if name, _, ok := strings.Cut(authority[:i], ":"); ok {
			authority = name + ":xxxxx" + authority[i:]
		}
	}
	if path, rawQuery, ok := strings.Cut(tail, "?"); ok {
		parts := strings.Split(rawQuery, "&")
		for i, kv := range parts {
			if k, _, ok := strings.Cut(kv, "="); ok && (k == "password" || k == "sentinel_password") {
				parts[i] = k + "=xxxxx"
			}
		}
		tail = path + "?" + strings.Join(parts, "&")
	}
	return scheme + "://" + authority + tail
}
