package inbox_test

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/inboxtype"
	"github.com/inboxmq/inboxmq/internal/pgtest"
	"github.com/inboxmq/inboxmq/internal/testenv"
	"github.com/inboxmq/inboxmq/retry"
)

// commitMsg is pgx's COMMIT on the wire: a simple Query message.
var commitMsg = []byte("Q\x00\x00\x00\x0bcommit\x00")

// commitDropper is a TCP proxy to the test database that, once armed, lets
// the next COMMIT through and drops the connection when the server answers
// it, before the answer reaches the client: the transaction commits, and
// the client gets an error — a COMMIT whose answer was lost.
type commitDropper struct {
	ln     net.Listener
	target string
	// match is what marks the client's message that commits: pgx's COMMIT
	// (commitMsg) unless set before the first connection.
	match []byte
	armed atomic.Bool
	fired chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

func newCommitDropper(t *testing.T) *commitDropper {
	t.Helper()
	u, err := url.Parse(testenv.DatabaseURL())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	d := &commitDropper{ln: ln, target: u.Host, match: commitMsg, fired: make(chan struct{})}
	d.wg.Go(d.serve)
	t.Cleanup(func() {
		_ = ln.Close()
		d.wg.Wait()
	})
	return d
}

func (d *commitDropper) serve() {
	for {
		client, err := d.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", d.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		var commitSent atomic.Bool
		drop := func() {
			_ = client.Close()
			_ = server.Close()
		}
		d.wg.Go(func() { // client → server
			defer drop()
			buf := make([]byte, 32<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					if d.armed.Load() && bytes.Contains(buf[:n], d.match) && d.armed.CompareAndSwap(true, false) {
						commitSent.Store(true)
					}
					if _, werr := server.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
		d.wg.Go(func() { // server → client
			defer drop()
			buf := make([]byte, 32<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 && commitSent.Load() {
					// The server answered the COMMIT: it is committed. The
					// answer is not passed on.
					d.once.Do(func() { close(d.fired) })
					return
				}
				if n > 0 {
					if _, werr := client.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	}
}

// pool returns a pool on schema through the proxy.
func (d *commitDropper) pool(t *testing.T, schema string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(schema))
	require.NoError(t, err)
	cfg.ConnConfig.Host = "127.0.0.1"
	addr := d.ln.Addr().(*net.TCPAddr)
	cfg.ConnConfig.Port = uint16(addr.Port)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// A group commit whose COMMIT took effect but whose answer was lost: the
// batch's deliveries run again one by one, find their keys completed, and
// are duplicates — acked, one effect each, none run twice into the
// database. In transactional mode and for claim mode's completions.
func TestGroupCommit_CommitAnswerLostIsADuplicateForEveryDelivery(t *testing.T) {
	t.Parallel()
	const n = 4
	for _, mode := range []string{"transactional", "claim"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			d := newCommitDropper(t)
			_, schema := pgtest.SchemaWith(t, 1)
			b := setupOn(t, d.pool(t, schema), nil)
			group := &inbox.GroupCommit{MaxBatch: n, MaxWait: time.Minute, MaxInFlight: 1}
			var h inboxtype.Handler[order]
			if mode == "claim" {
				h = inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
					return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error { return effectHandler(nil)(ctx, tx, msg) })
				}, group, nil)
			} else {
				h = inbox.Handler(b.store, effectHandler(nil), group)
			}

			d.armed.Store(true)
			for i, err := range handleAll(t, h, orders(t, n)) {
				require.ErrorIs(t, err, retry.ErrDuplicate, "delivery %d", i)
				require.Equal(t, retry.KindDuplicate, retry.Classify(err).Kind)
			}
			testenv.WaitChan(t, d.fired, "the batch's COMMIT answered and dropped")
			require.Equal(t, n, b.count(t, `SELECT count(*) FROM effects`), "one effect per key")
			require.Equal(t, n, b.count(t, `SELECT count(DISTINCT key) FROM effects`))
			require.Equal(t, n, b.count(t, `SELECT count(*) FROM inboxmq_inbox WHERE status = 'completed'`))
		})
	}
}

// One delivery's COMMIT took effect but its answer was lost (the primary
// died or the network broke at that instant): the outcome is unknown to
// the worker, so the delivery is not acked as done. It fails with a
// retryable error (the consumer retries or requeues it, never acks it as
// handled), and its next delivery finds the key completed: a duplicate,
// one effect. In transactional mode and for claim mode's completion.
func TestHandler_CommitAnswerLostIsRetriedThenADuplicate(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"transactional", "claim"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			d := newCommitDropper(t)
			_, schema := pgtest.SchemaWith(t, 1)
			b := setupOn(t, d.pool(t, schema), nil)
			var h inboxtype.Handler[order]
			if mode == "claim" {
				h = inbox.ClaimHandler(b.store, func(ctx context.Context, c *inbox.Claim, msg *inboxtype.Message[order]) error {
					return c.Complete(ctx, func(ctx context.Context, tx pgx.Tx) error { return effectHandler(nil)(ctx, tx, msg) })
				}, nil, nil)
			} else {
				h = inbox.Handler(b.store, effectHandler(nil), nil)
			}
			o := order{OrderID: "1", Amount: 5}

			d.armed.Store(true)
			err := h.Handle(t.Context(), newMsg(t, "payments", o, false))
			testenv.WaitChan(t, d.fired, "the COMMIT answered and dropped")
			require.Error(t, err, "an unknown commit outcome is not success")
			require.Equal(t, retry.KindRetry, retry.Classify(err).Kind, "%v", err)

			require.ErrorIs(t, h.Handle(t.Context(), newMsg(t, "payments", o, true)), retry.ErrDuplicate)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`), "one effect")
			require.Equal(t, inbox.RecordCompleted, b.get(t, "payments", o.IdempotencyKey()).Status)
		})
	}
}
