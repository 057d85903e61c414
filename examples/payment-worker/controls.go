package main

import (
	"context"
	"errors"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/consumer"
	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
)

// consumerTarget lets the controls watcher exist before the consumer (the
// Block middleware needs the watcher when the router is built, and the
// consumer needs the router): c is set before the watcher starts.
type consumerTarget struct{ c *consumer.Consumer }

func (t *consumerTarget) Pause(queue string) error  { return t.c.Pause(queue) }
func (t *consumerTarget) Resume(queue string) error { return t.c.Resume(queue) }
func (t *consumerTarget) SetConcurrency(queue string, n int) error {
	return t.c.SetConcurrency(queue, n)
}

// redialParker parks deliveries of blocked keys (inboxctl block) in
// "<queue>.parked". It owns a broker connection of its own and dials it
// again when it is gone, so parking survives a broker restart.
type redialParker struct {
	url, name string

	mu     sync.Mutex
	conn   *amqp.Connection
	parker *control.Parker
}

func (p *redialParker) Park(ctx context.Context, d *inboxtype.Delivery, b control.Block) error {
	pk, err := p.current()
	if err != nil {
		return err
	}
	err = pk.Park(ctx, d, b)
	if err == nil || !p.lost() {
		return err
	}
	// The connection died under us: dial once more and retry.
	if pk, err = p.current(); err != nil {
		return err
	}
	return pk.Park(ctx, d, b)
}

func (p *redialParker) lost() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn == nil || p.conn.IsClosed()
}

// current returns the parker on a live connection, dialing if needed.
func (p *redialParker) current() (*control.Parker, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil && !p.conn.IsClosed() {
		return p.parker, nil
	}
	conn, err := amqp.DialConfig(p.url, amqp.Config{
		Properties: amqp.Table{"connection_name": p.name},
		Heartbeat:  10 * time.Second,
	})
	if err != nil {
		return nil, errors.New("park: connect to " + consumer.RedactURL(p.url) + ": " + consumer.RedactURL(err.Error()))
	}
	p.conn, p.parker = conn, control.NewParker(conn)
	return p.parker, nil
}

func (p *redialParker) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	_ = p.parker.Close()
	return p.conn.Close()
}
