package inboxmq

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseRedisURL_Forms(t *testing.T) {
	t.Parallel()
	type want struct {
		kind           string // single, sentinel, cluster
		addrs          []string
		master         string
		db             int
		user, password string
		sentinelPass   string
		tls            bool
		dialTimeout    time.Duration
	}
	tests := []struct {
		url  string
		want want
	}{
		{"redis://127.0.0.1:6379/9", want{kind: "single", addrs: []string{"127.0.0.1:6379"}, db: 9}},
		{"rediss://u:p%40ss@cache.example:6380/1", want{kind: "single", addrs: []string{"cache.example:6380"}, db: 1, user: "u", password: "p@ss", tls: true}},
		{"redis+sentinel://h1:26379,h2:26380/mymaster", want{kind: "sentinel", addrs: []string{"h1:26379", "h2:26380"}, master: "mymaster"}},
		{"redis+sentinel://h1,h2/mymaster/3", want{kind: "sentinel", addrs: []string{"h1:26379", "h2:26379"}, master: "mymaster", db: 3}},
		{
			"redis+sentinel://:secret@h1/mymaster?db=2&sentinel_password=spw&dial_timeout=2s",
			want{kind: "sentinel", addrs: []string{"h1:26379"}, master: "mymaster", db: 2, password: "secret", sentinelPass: "spw", dialTimeout: 2 * time.Second},
		},
		{
			"rediss+sentinel://user:pw@s1.example:26379,s2.example:26379/m",
			want{kind: "sentinel", addrs: []string{"s1.example:26379", "s2.example:26379"}, master: "m", user: "user", password: "pw", tls: true},
		},
		{"REDIS+SENTINEL://[::1],[::2]:26380/m", want{kind: "sentinel", addrs: []string{"[::1]:26379", "[::2]:26380"}, master: "m"}},
		{"redis+cluster://h1:7000,h2:7001", want{kind: "cluster", addrs: []string{"h1:7000", "h2:7001"}}},
		{"redis+cluster://h1:7000/", want{kind: "cluster", addrs: []string{"h1:7000"}}},
		{"rediss+cluster://u:p@[::1]:7000,h2?read_timeout=1s", want{kind: "cluster", addrs: []string{"[::1]:7000", "h2:6379"}, user: "u", password: "p", tls: true}},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			tg, err := parseRedisURL(tt.url)
			require.NoError(t, err)
			tg.apply(nil)
			var got want
			var tc *tls.Config
			var cte bool
			switch {
			case tg.single != nil:
				o := tg.single
				got = want{kind: "single", addrs: []string{o.Addr}, db: o.DB, user: o.Username, password: o.Password, dialTimeout: o.DialTimeout}
				tc, cte = o.TLSConfig, o.ContextTimeoutEnabled
			case tg.failover != nil:
				o := tg.failover
				got = want{
					kind: "sentinel", addrs: o.SentinelAddrs, master: o.MasterName, db: o.DB, user: o.Username, password: o.Password,
					sentinelPass: o.SentinelPassword, dialTimeout: o.DialTimeout,
				}
				tc, cte = o.TLSConfig, o.ContextTimeoutEnabled
			default:
				o := tg.cluster
				got = want{kind: "cluster", addrs: o.Addrs, user: o.Username, password: o.Password, dialTimeout: o.DialTimeout}
				tc, cte = o.TLSConfig, o.ContextTimeoutEnabled
			}
			got.tls = tc != nil
			require.Equal(t, tt.want, got)
			require.True(t, cte, "ContextTimeoutEnabled")
			if tc != nil && tg.single == nil {
				require.Empty(t, tc.ServerName, "each address is checked against its own host name")
				require.GreaterOrEqual(t, tc.MinVersion, uint16(tls.VersionTLS12))
			}
		})
	}
}

func TestParseRedisURL_OptsOverride(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"redis://h:1/0?dial_timeout=9s", "redis+sentinel://h/m?dial_timeout=9s", "redis+cluster://h?dial_timeout=9s"} {
		tg, err := parseRedisURL(u)
		require.NoError(t, err)
		tg.apply(&RedisOpts{DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
		switch {
		case tg.single != nil:
			require.Equal(t, time.Second, tg.single.DialTimeout)
			require.Equal(t, 2*time.Second, tg.single.ReadTimeout)
		case tg.failover != nil:
			require.Equal(t, time.Second, tg.failover.DialTimeout)
			require.Equal(t, 2*time.Second, tg.failover.ReadTimeout)
		default:
			require.Equal(t, time.Second, tg.cluster.DialTimeout)
			require.Equal(t, 2*time.Second, tg.cluster.ReadTimeout)
		}
	}
}

func TestParseRedisURL_BadURLsNeverShowCredentials(t *testing.T) {
	t.Parallel()
	const secret = "topsecret"
	tests := []struct{ url, want string }{
		{"localhost:6379", "want redis://"},
		{"u:topsecret@localhost:6379", "want redis://"},
		{"http://u:topsecret@h/", `unknown scheme "http"`},
		{"redis+foo://u:topsecret@h", `unknown scheme "redis+foo"`},
		{"redis+sentinel://u:topsecret@h1,h2", "master set's name"},
		{"redis+sentinel://u:topsecret@h1/m/x", `invalid database number "x"`},
		{"redis+sentinel://u:topsecret@h1/m/1/2", "master set's name"},
		{"redis+sentinel://u:topsecret@h1/m/1?db=2", "named twice"},
		{"redis+sentinel://u:topsecret@h1,,h2/m", "empty host"},
		{"redis+sentinel://u:topsecret@h1:99999/m", "invalid port"},
		{"redis+sentinel://u:topsecret@h1:x/m", "invalid port"},
		{"redis+sentinel://u:topsecret@/m", "no host"},
		{"redis+sentinel://u:topsecret@h1/m?bogus=1", "unexpected option: bogus"},
		{"redis+sentinel://h1/m?password=topsecret", "option password is not allowed"},
		{"redis+sentinel://h1/m?sentinel_password=topsecret&bogus=1", "unexpected option: bogus"},
		{"redis+sentinel://u:top%zzsecret@h1/m", "invalid user information"},
		{"redis+sentinel://u:topsecret@h1/m#frag", "fragment"},
		{"redis+cluster://u:topsecret@h1/3", "only database 0"},
		{"redis+cluster://u:topsecret@h1?db=1", "only database 0"},
		{"redis+cluster://h1?sentinel_password=topsecret", "for redis+sentinel"},
		{"redis://u:topsecret@h1:6379?addr=h2:6379", "use redis+cluster://"},
		{"redis://u:topsecret@h1:notaport/0", "not a valid URL"},
		{"redis://:topsecret@h/abc", "invalid database number"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			_, err := parseRedisURL(tt.url)
			require.Error(t, err)
			require.ErrorContains(t, err, tt.want)
			require.Contains(t, err.Error(), "inboxmq: redis url ")
			require.NotContains(t, err.Error(), secret)
			require.NotContains(t, err.Error(), "top%zzsecret")

			_, err = RedisFromURL(tt.url, nil)
			require.Error(t, err)
		})
	}
}

func TestRedactRedisURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://h:6379/0":                              "redis://h:6379/0",
		"redis://u:pw@h:6379/0":                         "redis://u:xxxxx@h:6379/0",
		"rediss://:pw@h":                                "rediss://:xxxxx@h",
		"redis+sentinel://u:p@w@h1,h2/m?db=1":           "redis+sentinel://u:xxxxx@h1,h2/m?db=1",
		"redis+sentinel://h1/m?sentinel_password=s&x=1": "redis+sentinel://h1/m?sentinel_password=xxxxx&x=1",
		"redis://h/0?password=s":                        "redis://h/0?password=xxxxx",
		"not a url u:pw@h":                              "<not a redis url>",
	} {
		require.Equal(t, want, redactRedisURL(in), in)
	}
}
