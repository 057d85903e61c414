package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxmq/inboxmq/internal/startstop"
)

// EffectCheck looks for the evidence that a stale claim's effect happened
// (a row the business transaction would have written, a charge found at
// the gateway by its idempotency key). It runs inside the reconciler's
// transaction, with the inbox row locked. true completes the claim.
type EffectCheck func(ctx context.Context, tx pgx.Tx, namespace, key string) (bool, error)

// ReconcilerConfig configures a [Reconciler]. A nil *ReconcilerConfig means
// defaults.
type ReconcilerConfig struct {
	// Interval is the time between the runs of a started reconciler.
	// Defaults to 1 minute.
	Interval time.Duration
	// Grace is how long past its lease a claim must be before it counts as
	// stale (a little longer than a heartbeat's delay). Defaults to 30s.
	Grace time.Duration
	// BatchSize is the most claims handled in one transaction. Defaults to
	// 100.
	BatchSize int
	// MaxAttempts marks a stale claim dead instead of releasing it once its
	// key has been claimed this many times (its fence: every claim counts,
	// those of workers that vanished included, which the broker attempt
	// does not see). Defaults to 10; -1 never marks claims dead.
	MaxAttempts int
	// EffectChecks maps a namespace to the check of its effect. A
	// namespace without one has its stale claims released for retry.
	// Defaults to none.
	EffectChecks map[string]EffectCheck
	// OnStale is told how many stale claims of a namespace a run found (the
	// stale_processing_records_total metric). Defaults to nil: no call.
	OnStale func(namespace string, n int)
	// Logger logs each stale claim with its owner, attempts and last error.
	// Defaults to the store's logger.
	Logger *slog.Logger
}

// Reconcile actions, the StaleClaim.Action values.
const (
	ActionCompleted = "completed" // the effect check found the evidence
	ActionReleased  = "released"  // status failed: safe to retry
	ActionDead      = "dead"      // MaxAttempts reached
	ActionNone      = "none"      // a dry run
)

// StaleClaim is one claim found past its lease (plus Grace).
type StaleClaim struct {
	// Namespace and Key identify the claim.
	Namespace string
	Key       string
	// Owner is the vanished worker's owner token.
	Owner *string
	// Fence is the claim's fence.
	Fence int64
	// Attempts is the broker attempt (x-attempt) of the delivery that
	// claimed the key last.
	Attempts int
	// LastError is the last recorded failure, if any.
	LastError *string
	// LeaseUntil is when the claim's lease ended.
	LeaseUntil time.Time
	// Action is what the run did (one of the Action constants).
	Action string
}

// ReconcileReport is the outcome of one reconciler run.
type ReconcileReport struct {
	// DryRun is the run's dryRun argument.
	DryRun bool
	// Claims are the stale claims found, with the action taken on each.
	Claims []StaleClaim
	// Completed, Released and Dead count the actions.
	Completed int
	Released  int
	Dead      int
}

// Reconciler finds claims of claim/lease mode whose worker vanished (past
// lease_until + Grace), reports them, and decides from evidence: an
// EffectCheck that finds the effect completes the claim; otherwise the
// claim is released for retry, or marked dead after MaxAttempts. Several
// reconcilers may run at once: only one acts on each claim.
type Reconciler struct {
	s   *Store
	cfg ReconcilerConfig
	svc startstop.Service // the background loop's lifecycle
}

// NewReconciler returns a reconciler on s's inbox.
func NewReconciler(s *Store, cfg *ReconcilerConfig) (*Reconciler, error) {
	if s == nil {
		return nil, errors.New("inbox: nil store")
	}
	var c ReconcilerConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Interval <= 0 {
		c.Interval = time.Minute
	}
	if c.Grace < 0 {
		return nil, fmt.Errorf("inbox: negative Grace %s", c.Grace)
	}
	if c.Grace == 0 {
		c.Grace = 30 * time.Second
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 100
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	if c.MaxAttempts < -1 {
		return nil, fmt.Errorf("inbox: MaxAttempts %d: want -1 (never) or a positive bound", c.MaxAttempts)
	}
	if c.Logger == nil {
		c.Logger = s.cfg.Logger
	}
	return &Reconciler{s: s, cfg: c, svc: startstop.Service{Name: "inbox: reconciler"}}, nil
}

// Start reconciles in the background every Interval (the first run at
// once) until [Reconciler.Stop]; ctx's cancellation does not stop it.
// Errors of a run are logged and the next run tries again. A Start while
// the reconciler runs returns an error.
func (r *Reconciler) Start(ctx context.Context) error {
	return r.svc.Start(ctx, nil, r.loop)
}

// Stop ends the background loop and waits for it, bounded by ctx (if ctx
// ends first, it returns an error joined with ctx.Err() and the loop ends
// in the background). A run in progress is interrupted: its transaction
// rolls back, and the claims it held are found again by the next run. It
// is idempotent and safe without Start.
func (r *Reconciler) Stop(ctx context.Context) error { return r.svc.Stop(ctx) }

// Stopped returns a channel closed when the loop started by the last Start
// has ended (closed before any Start).
func (r *Reconciler) Stopped() <-chan struct{} { return r.svc.Stopped() }

func (r *Reconciler) loop(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := r.RunOnce(ctx, false); err != nil && ctx.Err() == nil {
			r.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "inbox: reconcile", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// RunOnce runs one reconciliation of at most BatchSize claims in one
// transaction. With dryRun it only reports what it found (Action none) and
// changes nothing.
func (r *Reconciler) RunOnce(ctx context.Context, dryRun bool) (ReconcileReport, error) {
	rep := ReconcileReport{DryRun: dryRun}
	if err := r.s.ready(); err != nil {
		return rep, err
	}
	err := pgx.BeginFunc(ctx, r.s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, r.s.sql.staleForUpdate, r.cfg.Grace.Microseconds(), r.cfg.BatchSize)
		if err != nil {
			return err
		}
		claims, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StaleClaim, error) {
			var c StaleClaim
			err := row.Scan(&c.Namespace, &c.Key, &c.Owner, &c.Fence, &c.Attempts, &c.LastError, &c.LeaseUntil)
			return c, err
		})
		if err != nil {
			return err
		}
		for i := range claims {
			c := &claims[i]
			c.Action = ActionNone
			if !dryRun {
				if err := r.act(ctx, tx, c); err != nil {
					return err
				}
			}
		}
		rep.Claims = claims
		if dryRun {
			return errDryRun
		}
		return nil
	})
	if err != nil && !errors.Is(err, errDryRun) {
		return ReconcileReport{DryRun: dryRun}, fmt.Errorf("inbox: reconcile: %w", err)
	}
	perNamespace := map[string]int{}
	for _, c := range rep.Claims {
		perNamespace[c.Namespace]++
		switch c.Action {
		case ActionCompleted:
			rep.Completed++
		case ActionReleased:
			rep.Released++
		case ActionDead:
			rep.Dead++
		}
		r.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "inbox: stale claim",
			slog.String("namespace", c.Namespace), slog.String("key", c.Key), optionalString("owner", c.Owner),
			slog.Int64("fence", c.Fence), slog.Int("attempts", c.Attempts), optionalString("last_error", c.LastError),
			slog.Time("lease_until", c.LeaseUntil), slog.String("action", c.Action), slog.Bool("dry_run", dryRun))
	}
	if r.cfg.OnStale != nil {
		for name, n := range perNamespace {
			r.cfg.OnStale(name, n)
		}
	}
	return rep, nil
}

var errDryRun = errors.New("inbox: dry run")

func (r *Reconciler) act(ctx context.Context, tx pgx.Tx, c *StaleClaim) error {
	if check := r.cfg.EffectChecks[c.Namespace]; check != nil {
		found, err := check(ctx, tx, c.Namespace, c.Key)
		if err != nil {
			return fmt.Errorf("effect check of %s/%s: %w", c.Namespace, c.Key, err)
		}
		if found {
			if _, err := tx.Exec(ctx, r.s.sql.reconcileComplete, c.Namespace, c.Key, c.Fence); err != nil {
				return err
			}
			c.Action = ActionCompleted
			return nil
		}
	}
	status, action := RecordFailed, ActionReleased
	if r.cfg.MaxAttempts > 0 && c.Fence >= int64(r.cfg.MaxAttempts) {
		status, action = RecordDead, ActionDead
	}
	owner := "<none>"
	if c.Owner != nil {
		owner = *c.Owner
	}
	msg := fmt.Sprintf("inbox: reconciler: claim %d of owner %s expired at %s", c.Fence, owner, c.LeaseUntil.UTC().Format(time.RFC3339))
	if _, err := tx.Exec(ctx, r.s.sql.reconcileRelease, c.Namespace, c.Key, c.Fence, status, msg); err != nil {
		return err
	}
	c.Action = action
	return nil
}

// optionalString is p's text under key, or a null value for nil.
func optionalString(key string, p *string) slog.Attr {
	if p == nil {
		return slog.Any(key, nil)
	}
	return slog.String(key, *p)
}
