package amqpdial_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/amqpdial"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		list  string
		addrs []string
		err   string
	}{
		{name: "one URL", list: "amqp://guest:guest@127.0.0.1:5672/", addrs: []string{"127.0.0.1:5672"}},
		{name: "default ports", list: "amqp://h1/,amqps://h2/", addrs: []string{"h1:5672", "h2:5671"}},
		{
			name: "list with spaces", list: " amqp://u:p@r1:5673/v , amqp://u:p@r2:5674/v,AMQP://u:p@r3/v ",
			addrs: []string{"r1:5673", "r2:5674", "r3:5672"},
		},
		{name: "comma in a password", list: "amqp://u:pa,ss@h1/,amqp://u:p@h2/", addrs: []string{"h1:5672", "h2:5672"}},
		{name: "vhost with an encoded @ and comma", list: "amqp://u:p@h1/team%40x%2Cy", addrs: []string{"h1:5672"}},
		{name: "IPv6", list: "amqp://[::1]:5673/", addrs: []string{"[::1]:5673"}},
		{name: "empty", list: " ", err: "no broker URL"},
		{name: "bad scheme in the list", list: "amqp://u:s3cret@h1/,http://u:s3cret@h2/", err: `broker URL 2 of 2 ("http://u:xxxxx@h2/") must use amqp:// or amqps://`},
		{name: "stray comma", list: "amqp://h1/,,amqp://h2/", err: "is empty (a stray comma?)"},
		{name: "trailing comma", list: "amqp://h1/,", err: "broker URL 2 of 2"},
		{name: "hosts without schemes", list: "amqp://u:s3cret@h1:5672,h2:5672/", err: "give every node as a full amqp:// URL"},
		{name: "no host", list: "amqp:///vhost", err: "has no host"},
		{name: "unparseable", list: "amqp://u:s3cret@h1/,amqp://%zz", err: `("<unparseable url>") is not a valid URL`},
		{name: "mistyped scheme swallowed", list: "amqp://u:s3cret@h1/,amqp//u:s3cret@h2/", err: "has a comma or @ after its host"},
		{name: "listed twice", list: "amqp://u:s3cret@h1/,amqp://u:s3cret@h1/", err: "listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			nodes, err := amqpdial.Parse(tt.list)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				require.NotContains(t, err.Error(), "s3cret", "the password never appears")
				return
			}
			require.NoError(t, err)
			addrs := make([]string, len(nodes))
			for i, n := range nodes {
				addrs[i] = n.Addr
			}
			require.Equal(t, tt.addrs, addrs)
		})
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	require.Equal(t, "amqp://guest:xxxxx@h:5672/", amqpdial.Redact("amqp://guest:s3cret@h:5672/"))
	require.Equal(t, "amqp://a:xxxxx@h1/,amqps://b:xxxxx@h2:5671/v",
		amqpdial.Redact("amqp://a:s3cret@h1/, amqps://b:other@h2:5671/v"))
	require.Equal(t, "amqp://a:xxxxx@h1/,<unparseable url>", amqpdial.Redact("amqp://a:s3cret@h1/,amqp://b:other@%zz"))
	require.Equal(t, "<unparseable url>", amqpdial.Redact("amqp://a:s3cret@%zz"))
	require.Equal(t, "amqp://a:xxxxx@h1/<hidden>", amqpdial.Redact("amqp://a:s3cret@h1/,amqp//b:other@h2/"))
}
