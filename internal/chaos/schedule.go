package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"
)

// faultsFor returns the configured faults that apply to the scenario.
func (r *scenarioRun) faultsFor() []string {
	var out []string
	for _, f := range r.cfg.Faults {
		if (f == FaultGatewaySlow || f == FaultGatewayFail) && r.gw == nil {
			continue
		}
		out = append(out, f)
	}
	return out
}

// injectLoop injects faults on the seeded schedule until the fault phase
// (cfg.Duration) is over. Faults run one at a time.
func (r *scenarioRun) injectLoop(ctx context.Context) {
	kinds := r.faultsFor()
	end := r.start.Add(r.cfg.Duration)
	// The time an injection itself takes (rabbitmqctl boots an Erlang VM
	// per call, seconds on a loaded machine) does not count against the
	// fault phase, up to one more Duration: the schedule's faults happen
	// whatever the tools cost, and the phase stays bounded.
	latest := end.Add(r.cfg.Duration)
	for len(kinds) > 0 {
		gap := time.Duration(float64(r.cfg.FaultEvery) * (0.5 + r.rnd.Float64()))
		kind := kinds[r.rnd.IntN(len(kinds))]
		target := r.rnd.IntN(len(r.workers))
		if time.Now().Add(gap).After(end) {
			break
		}
		t := time.NewTimer(gap)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		injected := time.Now()
		ev := r.inject(ctx, kind, r.workers[target])
		if spent := time.Since(injected) - ev.Recovery; spent > 0 {
			end = end.Add(spent)
			if end.After(latest) {
				end = latest
			}
		}
		r.rep.Faults = append(r.rep.Faults, ev)
		rec := "-"
		if ev.Recovery > 0 {
			rec = ev.Recovery.Round(time.Millisecond).String()
		}
		fmt.Fprintf(r.cfg.Log, "chaos: %6.1fs %-13s worker %2d  %-34s recovered in %s %s\n",
			ev.At.Seconds(), ev.Kind, ev.Worker, ev.Detail, rec, ev.Err)
	}
	if rem := time.Until(end); rem > 0 {
		t := time.NewTimer(rem)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// inject applies one fault to w (or to the run) and measures recovery.
func (r *scenarioRun) inject(ctx context.Context, kind string, w *worker) FaultEvent {
	ev := FaultEvent{At: time.Since(r.start), Kind: kind, Worker: w.idx}
	before := r.ledgerCount(ctx)
	baseline, _ := w.scrape.processed(ctx)
	reconnects := -1.0
	if v, ok := w.scrape.current(ctx, reconnectsMetric); ok {
		reconnects = v
	}
	connLost := false // measure recovery as reconnection
	target := w
	var err error
	switch kind {
	case FaultKill:
		w.kill()
		w.scrape.restarted()
		ev.Detail, baseline = "SIGKILL + restart", 0
		err = w.start()
	case FaultRestart:
		_ = w.signal(syscall.SIGTERM)
		exited, werr := w.wait(30 * time.Second)
		switch {
		case !exited:
			r.violate("unclean stop: worker %d did not exit within 30s of SIGTERM", w.idx)
			w.kill()
		case werr != nil:
			r.violate("unclean stop: worker %d exited with %v after SIGTERM (log %s)", w.idx, werr, w.logPath)
		}
		w.scrape.restarted()
		ev.Detail, baseline = "SIGTERM + restart", 0
		err = w.start()
	case FaultBrokerConn:
		var n int
		n, err = CloseBrokerConnections(ctx, w.pid())
		ev.Detail = fmt.Sprintf("closed %d connections", n)
		connLost = err == nil && n > 0 && reconnects >= 0
	case FaultPGTerminate:
		var n int
		n, err = TerminateBackends(ctx, r.pool, w.appName, w.pid())
		ev.Detail = fmt.Sprintf("terminated %d backends", n)
	case FaultRedisFlush:
		var n int
		n, err = FlushRedisKeys(ctx, r.rdb, r.runID)
		ev.Detail, ev.Worker, target = fmt.Sprintf("deleted %d keys", n), -1, nil
	case FaultRedisRestart:
		down := time.Duration(500+r.rnd.IntN(2500)) * time.Millisecond
		if r.redis == nil {
			err = errors.New("chaos: redis-restart needs the run's own Redis server (Config.RestartRedis)")
			break
		}
		err = r.redis.restart(ctx, down)
		ev.Detail, ev.Worker, target = fmt.Sprintf("down for %s", down), -1, nil
	case FaultPGRestart:
		down := time.Duration(1000+r.rnd.IntN(3000)) * time.Millisecond
		if r.pg == nil {
			err = errors.New("chaos: pg-restart needs the run's own PostgreSQL server (Config.RestartPostgres)")
			break
		}
		err = r.pg.restart(ctx, down)
		ev.Detail, ev.Worker, target = fmt.Sprintf("down for %s", down), -1, nil
	case FaultStop:
		pause := r.cfg.LockTTL + time.Second
		if err = w.signal(syscall.SIGSTOP); err == nil {
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			err = w.signal(syscall.SIGCONT)
		}
		ev.Detail = fmt.Sprintf("SIGSTOP for %s", pause)
	case FaultGatewaySlow:
		p := GatewayPhase{Delay: time.Duration(200+r.rnd.IntN(1300)) * time.Millisecond}
		d := time.Duration(1000+r.rnd.IntN(3000)) * time.Millisecond
		r.gw.SetPhase(p, d)
		ev.Detail, ev.Worker, target = fmt.Sprintf("+%s per call for %s", p.Delay, d), -1, nil
		return ev
	case FaultGatewayFail:
		p := GatewayPhase{FailRate: 0.3, LostReplyRate: 0.2}
		d := time.Duration(500+r.rnd.IntN(1500)) * time.Millisecond
		r.gw.SetPhase(p, d)
		ev.Detail, ev.Worker, target = fmt.Sprintf("503 30%%, lost reply 20%% for %s", d), -1, nil
		return ev
	}
	if err != nil {
		ev.Err = err.Error()
		return ev
	}
	progress := func() bool { // the target worker finished a delivery since the fault
		n, ok := target.scrape.processed(ctx)
		return ok && n > baseline
	}
	if connLost {
		// A closed connection is recovered when the worker has connected
		// again (its reconnect counter rose and it reports a connection).
		progress = func() bool {
			rc, ok1 := target.scrape.current(ctx, reconnectsMetric)
			up, ok2 := target.scrape.current(ctx, connectedMetric)
			return ok1 && ok2 && rc > reconnects && up >= 1
		}
	}
	if target == nil {
		progress = nil
	}
	ev.Recovery, err = r.recovered(ctx, target, before, progress, connLost)
	if connLost {
		if rc, ok := target.scrape.current(ctx, reconnectsMetric); ok {
			ev.Detail += fmt.Sprintf(", reconnects %.0f→%.0f", reconnects, rc)
		}
	}
	if err != nil {
		ev.Err = err.Error()
		r.violate("no recovery after %s on worker %d at %.1fs: %v", kind, w.idx, ev.At.Seconds(), err)
	}
	return ev
}

// recovered waits until the run made progress again after a fault. With a
// target worker w: w is ready and progress reports true (by default: w
// finished a delivery since the fault; after a closed connection: w
// connected again). Without one: a new ledger entry since before. Except
// after a closed connection, an empty work queue also counts (nothing left
// to make progress on).
func (r *scenarioRun) recovered(ctx context.Context, w *worker, before int, progress func() bool, connLost bool) (time.Duration, error) {
	start := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if w == nil {
			if r.ledgerCount(ctx) > before {
				return time.Since(start), nil
			}
		} else if w.ready(ctx) && progress() {
			return time.Since(start), nil
		}
		if !connLost && (w == nil || w.ready(ctx)) {
			if n, err := r.depth(r.queue); err == nil && n == 0 {
				return time.Since(start), nil
			}
		}
		if time.Since(start) > time.Minute {
			return time.Since(start), fmt.Errorf("not ready or no progress within 1m")
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-tick.C:
		}
	}
}

// percentile returns the p-th percentile (0..1) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}
