package consumer

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/retry"
)

func TestConsumerTimeouts_ByBrokerVersion(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{
		"3.10.8": false, "3.11.14": false, "3.11.15": true, "3.12.0": true, "3.13.0-rc.1": true,
		"4.3.0": true, "": false, "x.y": false, "3": false,
	} {
		require.Equal(t, want, consumerTimeouts(amqp.Table{"product": "RabbitMQ", "version": v}), "version %q", v)
	}
	require.False(t, consumerTimeouts(amqp.Table{"product": "LavinMQ", "version": "4.0.0"}), "another broker")
	require.False(t, consumerTimeouts(nil))
}

func TestConsumeArgs_AskAboveTheLongestHold(t *testing.T) {
	t.Parallel()
	c := &Consumer{cfg: Config{HandlerTimeout: time.Minute, PublishTimeout: 10 * time.Second}}
	r := &route{}
	r.Opts.InProcess = retry.InProcess{Tries: 2, InitialInterval: time.Second, MaxInterval: time.Second}

	require.Nil(t, c.consumeArgs(r, false), "a broker without per-consumer timeouts is asked for none")
	args := c.consumeArgs(r, true)
	// Three runs of a minute and two pauses of a second, twice, plus the
	// publish timeout and a minute.
	require.Equal(t, amqp.Table{headerConsumerTimeout: (2*(3*time.Minute+2*time.Second) + 70*time.Second).Milliseconds()}, args)

	r.Opts.Ordered = &OrderedOpts{}
	require.Nil(t, c.consumeArgs(r, true), "an ordered route's hold follows its whole retry policy")
	r.Opts.Ordered = nil
	c.cfg.HandlerTimeout = 0
	require.Nil(t, c.consumeArgs(r, true), "an unbounded run asks for no timeout")
}
