package ui

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/inboxmq/inboxmq/inbox"
)

type claimsData struct {
	Grace   string
	Stale   []*inbox.Record
	More    bool
	Report  *inbox.ReconcileReport
	Reasons map[string]string
	Err     string
}

func (claimsData) title() string { return "Stale claims" }

// grace reads the grace form value (a duration), defaulting to the
// reconciler's.
func (con *Console) grace(r *http.Request) (time.Duration, error) {
	g := r.FormValue("grace")
	if g == "" {
		if con.cfg.Reconciler != nil && con.cfg.Reconciler.Grace > 0 {
			return con.cfg.Reconciler.Grace, nil
		}
		return 30 * time.Second, nil
	}
	d, err := time.ParseDuration(g)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("ui: grace %q: want a duration such as 30s", g)
	}
	return d, nil
}

func (con *Console) claims(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	g, err := con.grace(r)
	if err != nil {
		con.fail(w, r, http.StatusBadRequest, err)
		return
	}
	d := claimsData{Grace: g.String()}
	s, err := con.inbox(ctx)
	if err == nil {
		sctx, cancel := context.WithTimeout(ctx, con.cfg.QueryTimeout)
		d.Stale, err = s.Stale(sctx, g)
		cancel()
	}
	if err != nil {
		d.Err = con.redact(err.Error())
	}
	if len(d.Stale) > con.cfg.PageSize*4 {
		d.Stale, d.More = d.Stale[:con.cfg.PageSize*4], true
	}
	con.render(w, r, http.StatusOK, "claims", d)
}

// reconciler builds a one-pass reconciler with the console's settings and
// the operator's grace.
func (con *Console) reconciler(ctx context.Context, grace time.Duration) (*inbox.Reconciler, error) {
	s, err := con.inbox(ctx)
	if err != nil {
		return nil, err
	}
	var rc inbox.ReconcilerConfig
	if con.cfg.Reconciler != nil {
		rc = *con.cfg.Reconciler
	}
	rc.Grace = grace
	rc.Logger = con.logger()
	return inbox.NewReconciler(s, &rc)
}

// reasons says why the reconciler decides what it decides for a claim.
func (con *Console) reasons(rep *inbox.ReconcileReport) map[string]string {
	maxAttempts := 10
	if con.cfg.Reconciler != nil && con.cfg.Reconciler.MaxAttempts != 0 {
		maxAttempts = con.cfg.Reconciler.MaxAttempts
	}
	out := make(map[string]string, len(rep.Claims))
	for _, c := range rep.Claims {
		hasCheck := con.cfg.Reconciler != nil && con.cfg.Reconciler.EffectChecks[c.Namespace] != nil
		var why string
		switch {
		case c.Action == inbox.ActionCompleted:
			why = "the effect check found the effect: completed"
		case c.Action == inbox.ActionDead:
			why = "claimed " + strconv.FormatInt(c.Fence, 10) + " times, the bound is " + strconv.Itoa(maxAttempts) + ": marked dead"
		case c.Action == inbox.ActionReleased:
			why = "no evidence of the effect: released (status failed), a redelivery or replay takes it up"
		case hasCheck:
			why = "would run the effect check; completed if it finds the effect, else released"
		case maxAttempts > 0 && c.Fence >= int64(maxAttempts):
			why = "would mark dead: claimed " + strconv.FormatInt(c.Fence, 10) + " times (bound " + strconv.Itoa(maxAttempts) + ")"
		default:
			why = "would release: no effect check for this namespace, so it becomes retryable (status failed)"
		}
		out[c.Namespace+"\x00"+c.Key] = why
	}
	return out
}

// claimsDryRun runs the reconciler without changing anything and shows
// what it would do, with the form that acts.
func (con *Console) claimsDryRun(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	g, err := con.grace(r)
	if err != nil {
		con.fail(w, r, http.StatusBadRequest, err)
		return
	}
	d := claimsData{Grace: g.String()}
	rec, err := con.reconciler(ctx, g)
	if err == nil {
		var rep inbox.ReconcileReport
		rctx, cancel := context.WithTimeout(ctx, con.cfg.QueryTimeout)
		rep, err = rec.RunOnce(rctx, true)
		cancel()
		d.Report = &rep
		d.Reasons = con.reasons(&rep)
	}
	if err != nil {
		d.Err = con.redact(err.Error())
	}
	con.render(w, r, http.StatusOK, "claims", d)
}

func (con *Console) reconcile(r *http.Request, actor string) actionResult {
	ctx := r.Context()
	res := actionResult{back: "/claims"}
	g, err := con.grace(r)
	if err != nil {
		res.err = err
		return res
	}
	res.back = "/claims?grace=" + qEsc(g.String())
	rec, err := con.reconciler(ctx, g)
	if err != nil {
		res.err = err
		return res
	}
	rep, err := rec.RunOnce(ctx, false)
	if err != nil {
		res.err = err
		return res
	}
	keys := make([]string, 0, len(rep.Claims))
	for _, c := range rep.Claims {
		keys = append(keys, c.Namespace+"/"+c.Key+"="+c.Action)
	}
	res.attrs = []slog.Attr{slog.String("grace", g.String()), slog.Any("keys", keys),
		slog.Int("released", rep.Released), slog.Int("dead", rep.Dead), slog.Int("completed", rep.Completed)}
	res.flash = fmt.Sprintf("Reconciled %d stale claims: %d released, %d dead, %d completed.", len(rep.Claims), rep.Released, rep.Dead, rep.Completed)
	for _, c := range rep.Claims {
		res.flash += " " + c.Namespace + "/" + c.Key + ": " + c.Action + "."
	}
	return res
}
