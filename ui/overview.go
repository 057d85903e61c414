package ui

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/ops"
	"github.com/inboxmq/inboxmq/outbox"
)

// queueRow is one queue of the overview.
type queueRow struct {
	Queue      Queue
	Summary    *ops.Summary
	SummaryErr string
	Control    *control.Control
	Blocks     int
	Work       ops.QueueDepth
	DLQ        ops.QueueDepth
	Parked     ops.QueueDepth
	Tiers      []ops.QueueDepth
	TierTotal  int
	BrokerErr  string
	// Reach is who obeys a change of the queue's controls (nil when the
	// workers cannot be read).
	Reach *ops.Reach
}

type overviewData struct {
	Queues    []queueRow
	Workers   workersView
	Outbox    *outbox.Backlog
	OutboxErr string
	Err       string
}

func (overviewData) title() string { return "Overview" }

func (con *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var d overviewData
	qs, err := con.queues(ctx)
	if err != nil {
		d.Err = con.redact(err.Error())
	}
	var snap *control.Snapshot
	if len(qs) > 0 {
		if snap, err = con.snapshot(ctx); err != nil {
			d.Err = con.redact(err.Error())
		}
	}
	d.Workers = con.workers(ctx)
	reach := reaches(qs, d.Workers, snap)
	for _, q := range qs {
		row := con.queueRow(ctx, q, snap)
		if r, ok := reach[q.Namespace]; ok {
			row.Reach = &r
		}
		d.Queues = append(d.Queues, row)
	}
	err = ops.Bounded(ctx, con.cfg.DB, con.cfg.QueryTimeout, func(tx pgx.Tx) error {
		b, err := outbox.ReadBacklog(ctx, tx)
		d.Outbox = &b
		return err
	})
	if err != nil {
		d.Outbox, d.OutboxErr = nil, con.redact(err.Error())
	}
	con.render(w, r, http.StatusOK, "overview", d)
}

// snapshot reads the controls in force, bounded by the query timeout.
func (con *Console) snapshot(ctx context.Context) (*control.Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, con.cfg.QueryTimeout)
	defer cancel()
	return con.controls.List(ctx)
}

func (con *Console) queueRow(ctx context.Context, q Queue, snap *control.Snapshot) queueRow {
	row := queueRow{Queue: q}
	if s, err := con.inbox(ctx); err != nil {
		row.SummaryErr = con.redact(err.Error())
	} else {
		err := ops.Bounded(ctx, con.cfg.DB, con.cfg.QueryTimeout, func(tx pgx.Tx) error {
			var err error
			row.Summary, err = ops.Summarize(ctx, tx, s.Table(), q.Namespace)
			return err
		})
		if err != nil {
			row.SummaryErr = con.redact(err.Error())
		}
	}
	if snap != nil {
		for i := range snap.Controls {
			if snap.Controls[i].Namespace == q.Namespace {
				row.Control = &snap.Controls[i]
			}
		}
		for _, b := range snap.Blocks {
			if b.Namespace == q.Namespace {
				row.Blocks++
			}
		}
	}
	conn, err := con.broker()
	if err != nil {
		row.BrokerErr = err.Error()
		return row
	}
	names := []string{q.Name, q.DeadLetterQueue, inboxtype.ParkedQueue(q.Name)}
	for _, t := range q.RetryTiers {
		names = append(names, inboxtype.RetryQueue(q.Name, t))
	}
	depths, err := ops.Depths(conn, names)
	if err != nil {
		row.BrokerErr = con.redact(err.Error())
		return row
	}
	row.Work, row.DLQ, row.Parked, row.Tiers = depths[0], depths[1], depths[2], depths[3:]
	for _, t := range row.Tiers {
		row.TierTotal += t.Messages
	}
	return row
}
