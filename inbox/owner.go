package inbox

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/internal/startstop"
)

// The owner session ties claim mode's claims to the life of the process
// that took them, as PostgreSQL sees it (docs/design.md, "Claims and their
// owners"). A started store holds one connection of its own with a
// session-level advisory lock on a random key; every claim it takes names
// that key (owner_session). The lock lives exactly as long as the session:
// when the process dies or the server restarts, it is gone, and a copy of
// the message may take the claim at once. A claim whose owner session is
// still there keeps its lease, the backstop for an owner that PostgreSQL
// cannot see die (a network partition, a paused process).

// ownerPing is how often the owner session is checked; it bounds how long
// a store goes on naming a session that has ended.
const ownerPing = time.Second

// ownerMaxPending bounds the releases kept for the database's return.
const ownerMaxPending = 10_000

// ownerSession is one owner session: its advisory-lock key.
type ownerSession struct {
	key int64
}

// owner is the store's owner session and the releases that failed while
// the database was away.
type owner struct {
	svc startstop.Service

	cur atomic.Pointer[ownerSession]

	mu      sync.Mutex
	pending []*Claim
}

// session returns the live owner session, nil when there is none (the
// store was not started, or the session is being re-established).
func (o *owner) session() *ownerSession { return o.cur.Load() }

func (o *owner) set(sess *ownerSession) { o.cur.Store(sess) }

// keep keeps c for a release when the database answers again.
func (o *owner) keep(c *Claim) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.pending) >= ownerMaxPending {
		return false
	}
	o.pending = append(o.pending, c)
	return true
}

func (o *owner) takePending() []*Claim {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := o.pending
	o.pending = nil
	return p
}

// Start holds the store's owner session until Stop: claim mode's claims
// taken meanwhile name it, so that when this process dies, another
// worker's copy of a message takes the claim at once rather than after its
// lease (the takeover is fenced: a late completion of the dead owner
// fails). When only the session ends (the server restarted, the backend
// was killed), the store opens a new one and adopts its claims still
// processing; until then a copy may take them, fenced the same way.
// Releases that failed while the database was away are retried when it
// answers again. Start returns once the first session is open; a claim
// taken while no session is open keeps only its lease. Without Start,
// claims are freed by their leases only. Call [Store.Check] first;
// Worker.Start does both.
func (s *Store) Start(ctx context.Context) error {
	if err := s.ready(); err != nil {
		return err
	}
	var first *heldSession
	return s.owner.svc.Start(ctx, func(ctx context.Context) (err error) {
		first, err = s.openSession(ctx)
		return err
	}, func(ctx context.Context) error {
		s.holdSessions(ctx, first)
		return nil
	})
}

// Stop gives the owner session up, bounded by ctx. Claims still held keep
// their leases.
func (s *Store) Stop(ctx context.Context) error { return s.owner.svc.Stop(ctx) }

// heldSession is an open owner session and its connection.
type heldSession struct {
	conn *pgx.Conn
	sess *ownerSession
}

// holdSessions holds h until it fails, then opens new sessions (each with
// a new key) until ctx ends.
//
// Losing a session does not stop the handlers of its claims: the process
// is alive and the likeliest to finish them. Until a new session adopts
// them, a copy of one of their messages may take the claim (fenced: this
// process's completion of it then fails); the new session adopts the
// claims still processing under the old key, after retrying the releases
// that failed meanwhile.
func (s *Store) holdSessions(ctx context.Context, h *heldSession) {
	var wait time.Duration
	var lost int64 // the key of the session lost, whose claims to adopt
	for {
		if h != nil {
			if lost != 0 {
				s.releasePending(ctx)
				s.adopt(ctx, lost, h.sess.key)
				lost = 0
			}
			err := s.holdSession(ctx, h)
			if ctx.Err() != nil {
				return
			}
			s.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "inbox: owner session lost; until it is back, a copy may take this worker's claims at once (fenced)",
				slog.Any("error", err))
			lost, wait = h.sess.key, 0 // at once: the database may be back already
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		var err error
		if h, err = s.openSession(ctx); err != nil {
			wait = min(max(2*wait, 100*time.Millisecond), 5*time.Second)
		}
	}
}

// adopt moves the claims still processing under the lost session's key to
// the new session, so that a live process's claims are again held until
// their leases run out. A claim taken over meanwhile names another key
// and is left alone.
func (s *Store) adopt(ctx context.Context, lost, key int64) {
	if !s.sessions {
		return // the table cannot name sessions (before migration 00007)
	}
	tag, err := s.pool.Exec(ctx, s.sql.adoptClaims, lost, key)
	if err != nil {
		s.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "inbox: adopting the claims of the lost owner session failed; they keep only their leases",
			slog.Any("error", err))
		return
	}
	if n := tag.RowsAffected(); n > 0 {
		s.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "inbox: claims adopted by the new owner session", slog.Int64("claims", n))
	}
}

// openSession opens an owner session: a connection of its own, taken out
// of the pool, holding the advisory lock of a new random key.
func (s *Store) openSession(ctx context.Context) (*heldSession, error) {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("inbox: open the owner session: %w", err)
	}
	conn := pc.Hijack() // the pool never hands it out again
	key := newSessionKey()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		closeConn(ctx, conn)
		return nil, fmt.Errorf("inbox: take the owner session's lock: %w", err)
	}
	h := &heldSession{conn: conn, sess: &ownerSession{key: key}}
	s.owner.set(h.sess)
	return h, nil
}

// holdSession holds h until it fails or ctx ends, then closes its
// connection.
func (s *Store) holdSession(ctx context.Context, h *heldSession) error {
	defer closeConn(ctx, h.conn) // ends the session, and with it the lock
	defer s.owner.set(nil)
	t := time.NewTicker(ownerPing)
	defer t.Stop()
	for {
		s.releasePending(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, 5*ownerPing)
		err := h.conn.Ping(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
}

func closeConn(ctx context.Context, conn *pgx.Conn) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = conn.Close(cctx)
}

// newSessionKey returns a random positive advisory-lock key.
func newSessionKey() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int64(binary.LittleEndian.Uint64(b[:])>>2) | 1 //nolint:gosec // 62 bits, positive
}

// releasePending retries the releases that failed while the database was
// away; a claim taken over meanwhile is left alone (the release is fenced).
func (s *Store) releasePending(ctx context.Context) {
	p := s.owner.takePending()
	for i, c := range p {
		if err := s.releaseOnce(ctx, c, c.releaseErr); err != nil {
			for _, rest := range p[i:] {
				s.owner.keep(rest)
			}
			return
		}
		s.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "inbox: claim released after the database came back",
			slog.String("namespace", c.Namespace), slog.String("key", c.Key), slog.Int64("fence", c.Fence))
	}
}
