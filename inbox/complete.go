package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Complete commits the claim: in one transaction it marks the row
// completed — fenced on this claim's owner token and fence — and runs fn
// (the business writes; nil for none). If the claim was taken over, nothing
// is written and the error matches retry.ErrDuplicate (source fenced). fn's
// errors roll everything back and are mapped with MapError. fn cannot end
// tx (as a TxHandlerFunc cannot), and tx is usable until fn returns. Calling
// Complete again after it succeeded returns nil without doing anything.
// With ClaimHandler's gc the transaction is a batch's, shared with
// the completions of other deliveries (see there).
func (c *Claim) Complete(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) (err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil
	}
	ctx, span := startSpan(ctx, "inbox.commit")
	defer func() { endSpan(span, err) }()
	if c.batch != nil {
		err = c.completeInBatch(ctx, fn)
	} else {
		err = c.completeAlone(ctx, fn)
	}
	c.done = err == nil
	return err
}

// completeInBatch hands the completion to the handler's group commit and
// waits for the batch's verdict: fenced out, fn's error, the commit's, or
// nil once committed.
func (c *Claim) completeInBatch(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	u := &unit{ctx: ctx, namespace: c.Namespace, key: c.Key, claim: c}
	u.run = func(ctx context.Context, tx pgx.Tx) error {
		u.pending = nil
		if fn != nil {
			if err := fn(ctx, tx); err != nil {
				return err
			}
		}
		return c.s.deferResult(u, c.resultBytes())
	}
	c.batch.do(u)
	if u.result != nil {
		c.won = u.result
	}
	if u.err == nil {
		c.stored = u.pending
	}
	return u.err
}

// completeAlone runs the completion in a transaction of its own.
func (c *Claim) completeAlone(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if fn == nil {
		// No business writes: the fenced completion, with the result if
		// any, is the whole transaction.
		raw := c.resultBytes()
		if raw != nil {
			if err := c.s.checkResult(c.Namespace, c.Key, raw); err != nil {
				return err
			}
		}
		if err := c.completeBare(ctx, raw); err != nil {
			return err
		}
		c.stored = raw
		return nil
	}
	// BEGIN and the fenced completion travel in one pipeline with fn's
	// first Exec (lazyTx's leadCompletion).
	tx := &c.tx
	*tx = lazyTx{lead: leadCompletion, claim: c}
	defer tx.rollback(context.WithoutCancel(ctx))
	if err := fn(ctx, tx); err != nil {
		if tx.err != nil { // the start's own verdict: fenced, or the connection
			return tx.err
		}
		return MapError(err)
	}
	raw := c.resultBytes()
	if raw != nil {
		if err := c.s.checkResult(c.Namespace, c.Key, raw); err != nil {
			return err
		}
	}
	if err := tx.ensure(ctx); err != nil {
		return err
	}
	// The result, if any, is written in COMMIT's round trip.
	var units []*unit
	if raw != nil {
		units = []*unit{{namespace: c.Namespace, key: c.Key, pending: raw}}
	}
	if err := c.s.commitResults(ctx, tx, units); err != nil {
		return err
	}
	c.stored = raw
	return nil
}

// resultBytes is the handler's result, if it set one.
func (c *Claim) resultBytes() []byte {
	if c.result == nil {
		return nil
	}
	return c.result.Result()
}

// completeBare completes a claim that has no business writes: the fenced
// completion, which also stores result (nil for none, already checked
// against MaxResultBytes), is then the whole transaction, sent as one
// autocommit statement — one round trip where BEGIN + completion, the
// result and COMMIT take two or three. It commits as durably as a COMMIT:
// the claim's asynchronous commit is local to the claim's own statement.
// Zero rows is the fenced verdict, as in start; an error may hide a
// completion that did commit, as a failed COMMIT may, and is retried alike
// (the release that follows is fenced and leaves a completed row alone).
// PostgreSQL refusing the result (bytes that are not UTF-8) committed
// nothing, and is classified by MapError, as when a statement writes it.
func (c *Claim) completeBare(ctx context.Context, result []byte) error {
	var arg any
	if result != nil {
		arg = string(result)
	}
	tag, err := c.s.pool.Exec(ctx, c.s.sql.completeWith, c.Namespace, c.Key, c.Token, c.Fence, arg)
	if err != nil {
		if perr := (*pgconn.PgError)(nil); result != nil && errors.As(err, &perr) && sqlClass(perr.Code) == "22" {
			return MapError(fmt.Errorf("inbox: store result: %w", err))
		}
		return infraError(ReasonDBCommit, fmt.Errorf("inbox: complete: %w", err))
	}
	if tag.RowsAffected() == 0 {
		return c.lost(ctx)
	}
	return nil
}
