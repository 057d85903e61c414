package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/consumer"
)

func TestNew_ValidatesConfig(t *testing.T) {
	t.Parallel()
	nop := inboxtype.HandlerFunc[order](func(context.Context, *inboxtype.Message[order]) error { return nil })
	router := func(opts *consumer.HandlerOpts) *consumer.Router {
		r := consumer.NewRouter()
		consumer.Register(r, "orders", nop, opts)
		return r
	}
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	tests := []struct {
		name    string
		cfg     *consumer.Config
		wantErr string
	}{
		{"nil config", nil, "nil Config"},
		{"missing URL", &consumer.Config{Router: router(nil)}, "URL is required"},
		{"wrong scheme", &consumer.Config{URL: "http://u:pw@h/", Router: router(nil)}, "amqp:// or amqps://"},
		{"unparseable URL", &consumer.Config{URL: "amqp://u:pw@h:port:bad/%zz", Router: router(nil)}, "not a valid URL"},
		{"missing router", &consumer.Config{URL: url}, "Router is required"},
		{"empty router", &consumer.Config{URL: url, Router: consumer.NewRouter()}, "no handlers"},
		{"bad name", &consumer.Config{URL: url, Router: router(nil), Name: "a\nb"}, "invalid Config.Name"},
		{"max below initial", &consumer.Config{URL: url, Router: router(nil), ReconnectInitialInterval: time.Second, ReconnectMaxInterval: time.Millisecond}, "below ReconnectInitialInterval"},
		{"negative soft stop", &consumer.Config{URL: url, Router: router(nil), SoftStopTimeout: -2}, "SoftStopTimeout"},
		{"negative publish timeout", &consumer.Config{URL: url, Router: router(nil), PublishTimeout: -1}, "PublishTimeout"},
		{"negative heartbeat", &consumer.Config{URL: url, Router: router(nil), Heartbeat: -1}, "Heartbeat"},
		{"quorum that could drop", &consumer.Config{URL: url, Router: router(&consumer.HandlerOpts{Queue: consumer.QueueOpts{
			Type: consumer.Quorum, Arguments: map[string]any{"x-overflow": "drop-head"},
		}})}, "x-overflow is managed by inboxmq"},
		{"reserved DLX argument", &consumer.Config{URL: url, Router: router(&consumer.HandlerOpts{Queue: consumer.QueueOpts{
			Arguments: map[string]any{"x-dead-letter-exchange": "elsewhere"},
		}})}, "x-dead-letter-exchange is managed"},
		{"queue that expires", &consumer.Config{URL: url, Router: router(&consumer.HandlerOpts{Queue: consumer.QueueOpts{
			Type: consumer.Quorum, Arguments: map[string]any{"x-expires": int64(60000)},
		}})}, "x-expires would delete the queue"},
		{"classic TTL dead-letters", &consumer.Config{URL: url, Router: router(&consumer.HandlerOpts{Queue: consumer.QueueOpts{
			Arguments: map[string]any{"x-message-ttl": int64(1000)},
		}})}, ""},
		{"classic length limit dead-letters", &consumer.Config{URL: url, Router: router(&consumer.HandlerOpts{Queue: consumer.QueueOpts{
			Arguments: map[string]any{"x-max-length": int64(10)},
		}})}, ""},
		{"classic queue that expires", &consumer.Config{URL: url, Router: router(&consumer.HandlerOpts{Queue: consumer.QueueOpts{
			Arguments: map[string]any{"x-expires": int64(60000)},
		}})}, "x-expires would delete the queue"},
		{"classic overflow", &consumer.Config{URL: url, Router: router(&consumer.HandlerOpts{Queue: consumer.QueueOpts{
			Arguments: map[string]any{"x-overflow": "reject-publish-dlx"},
		}})}, "x-overflow is managed by inboxmq"},
		{"quorum TTL dead-letters", &consumer.Config{URL: url, Router: router(&consumer.HandlerOpts{Queue: consumer.QueueOpts{
			Type: consumer.Quorum, Arguments: map[string]any{"x-message-ttl": int64(1000)},
		}})}, ""},
		{"valid with defaults", &consumer.Config{URL: url, Router: router(nil)}, ""},
		{"valid amqps with soft stop -1", &consumer.Config{URL: "amqps://u:p@broker:5671/vh", Router: router(nil), SoftStopTimeout: -1}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := consumer.New(tt.cfg)
			if tt.wantErr == "" {
				require.NoError(t, err)
				require.NotNil(t, c)
				require.Equal(t, inboxtype.ConnDisconnected, c.State())
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
			require.NotContains(t, err.Error(), ":pw@", "credentials never reach errors")
		})
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"amqp://guest:secret@host:5672/vh", "amqp://guest:xxxxx@host:5672/vh"},
		{"amqps://host/", "amqps://host/"},
		{"amqp://user@host/", "amqp://user@host/"},
		{"amqp://u:secret@host:bad:port/%zz", "<unparseable url>"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, consumer.RedactURL(tt.in), tt.in)
	}
}
