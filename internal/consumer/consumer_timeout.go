package consumer

import (
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// headerConsumerTimeout is the consumer argument of RabbitMQ's
// per-consumer delivery acknowledgement timeout (3.11.15 and later).
const headerConsumerTimeout = "x-consumer-timeout"

// consumerTimeouts reports whether the broker behind conn's server
// properties takes a per-consumer acknowledgement timeout: RabbitMQ
// 3.11.15 and later. An unknown version does not.
func consumerTimeouts(props amqp.Table) bool {
	if p, _ := props["product"].(string); p != "" && p != "RabbitMQ" {
		return false
	}
	v, _ := props["version"].(string)
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	num := func(s string) int {
		s, _, _ = strings.Cut(s, "-") // "3.13.0-rc.1"
		n, err := strconv.Atoi(s)
		if err != nil {
			return -1
		}
		return n
	}
	major, minor, patch := num(parts[0]), num(parts[1]), 0
	if len(parts) == 3 {
		patch = num(parts[2])
	}
	switch {
	case major < 0 || minor < 0:
		return false
	case major != 3:
		return major > 3
	case minor != 11:
		return minor > 11
	default:
		return patch >= 15
	}
}

// consumeArgs are the arguments of route r's consume on a session whose
// broker takes per-consumer timeouts (timeouts): the acknowledgement
// timeout of the deliveries it holds, set above the longest a delivery of
// the route may be held (holdBound), so the broker's own default (30 min)
// neither cuts a legitimate long run nor waits half an hour to take back
// a delivery whose handler is stuck. Nil without a bound.
func (c *Consumer) consumeArgs(r *route, timeouts bool) amqp.Table {
	if !timeouts {
		return nil
	}
	d := c.holdBound(r)
	if d <= 0 {
		return nil
	}
	return amqp.Table{headerConsumerTimeout: d.Milliseconds()}
}

// holdBound is the consumer timeout a route asks for: twice the longest a
// delivery may run (HandlerTimeout per try, the route's in-process tries
// and their pauses), plus the settlement's publish timeout and a minute.
// 0 when HandlerTimeout is unset (the run is unbounded) or for an ordered
// route, whose in-process retries follow the whole retry policy.
func (c *Consumer) holdBound(r *route) time.Duration {
	if c.cfg.HandlerTimeout <= 0 || r.Opts.Ordered != nil {
		return 0
	}
	tries := inProcessTries(r.Opts.InProcess)
	run := c.cfg.HandlerTimeout * time.Duration(1+tries)
	for n := 1; n <= tries; n++ {
		run += nominalInProcessDelay(r.Opts.InProcess, n)
	}
	return 2*run + c.cfg.PublishTimeout + time.Minute
}
