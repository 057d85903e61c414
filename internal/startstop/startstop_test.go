package startstop_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/startstop"
	"github.com/inboxmq/inboxmq/internal/testenv"
)

// probe is a service whose run reports that it runs and, unless stuck,
// returns when its context ends.
type probe struct {
	svc     startstop.Service
	running chan struct{} // closed when run begins
	stuck   chan struct{} // if set, run ignores its context until this closes
	runs    int           // completed runs
	cause   error         // context.Cause of the last run's context
	runErr  error         // what run returns
}

func newProbe() *probe {
	return &probe{svc: startstop.Service{Name: "test: probe"}}
}

func (p *probe) start(ctx context.Context, init func(context.Context) error) error {
	running, stuck := make(chan struct{}), p.stuck
	p.running = running
	return p.svc.Start(ctx, init, func(ctx context.Context) error {
		close(running)
		if stuck != nil {
			<-stuck // deaf to ctx: a select on both would return at once
		}
		<-ctx.Done()
		p.cause = context.Cause(ctx)
		p.runs++
		return p.runErr
	})
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestService(t *testing.T) {
	t.Parallel()
	errInit := errors.New("init failed")
	errRun := errors.New("run failed")
	tests := map[string]func(t *testing.T, p *probe){
		"start runs until stop": func(t *testing.T, p *probe) {
			ctx, cancel := context.WithCancel(t.Context())
			require.NoError(t, p.start(ctx, nil))
			testenv.WaitChan(t, p.running, "run begins")
			stopped := p.svc.Stopped()
			cancel() // the start ctx bounds only the start
			require.False(t, isClosed(stopped), "the run outlives the start ctx")
			require.NoError(t, p.svc.Stop(t.Context()))
			require.True(t, isClosed(stopped), "Stop waited for the run")
			require.ErrorIs(t, p.cause, startstop.ErrStopped)
			require.Equal(t, 1, p.runs)
		},
		"double start is refused": func(t *testing.T, p *probe) {
			require.NoError(t, p.start(t.Context(), nil))
			err := p.svc.Start(t.Context(), nil, func(context.Context) error {
				t.Error("second run started")
				return nil
			})
			require.ErrorIs(t, err, startstop.ErrAlreadyStarted)
			require.ErrorContains(t, err, "test: probe")
			require.NoError(t, p.svc.Stop(t.Context()))
			require.Equal(t, 1, p.runs)
		},
		"stop without start": func(t *testing.T, p *probe) {
			require.True(t, isClosed(p.svc.Stopped()), "stopped before any start")
			require.NoError(t, p.svc.Stop(t.Context()))
			require.NoError(t, p.start(t.Context(), nil), "a stop without start does not prevent a start")
			require.NoError(t, p.svc.Stop(t.Context()))
			require.Equal(t, 1, p.runs)
		},
		"stop twice": func(t *testing.T, p *probe) {
			p.runErr = errRun
			require.NoError(t, p.start(t.Context(), nil))
			require.ErrorIs(t, p.svc.Stop(t.Context()), errRun, "the run's error")
			require.NoError(t, p.svc.Stop(t.Context()), "returned once")
			require.Equal(t, 1, p.runs)
		},
		"stop is bounded by ctx while the run is stuck": func(t *testing.T, p *probe) {
			p.stuck = make(chan struct{})
			require.NoError(t, p.start(t.Context(), nil))
			testenv.WaitChan(t, p.running, "run begins")
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			err := p.svc.Stop(ctx)
			require.ErrorIs(t, err, context.Canceled)
			require.ErrorContains(t, err, "test: probe: stop")
			stopped := p.svc.Stopped()
			require.False(t, isClosed(stopped), "the run goes on in the background")
			require.ErrorIs(t, p.svc.Start(t.Context(), nil, nil), startstop.ErrAlreadyStarted, "still stopping")
			close(p.stuck)
			testenv.WaitChan(t, stopped, "the run ends in the background")
			require.NoError(t, p.svc.Stop(t.Context()))
			require.Equal(t, 1, p.runs)
		},
		"failed init leaves it stopped and startable": func(t *testing.T, p *probe) {
			err := p.start(t.Context(), func(context.Context) error { return errInit })
			require.ErrorIs(t, err, errInit)
			require.True(t, isClosed(p.svc.Stopped()))
			require.NoError(t, p.svc.Stop(t.Context()), "Start reported the error")
			require.Zero(t, p.runs, "run is not called after a failed init")
			require.NoError(t, p.start(t.Context(), func(context.Context) error { return nil }))
			require.NoError(t, p.svc.Stop(t.Context()))
			require.Equal(t, 1, p.runs)
		},
		"init gets the start ctx": func(t *testing.T, p *probe) {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			err := p.start(ctx, func(ctx context.Context) error { return ctx.Err() })
			require.ErrorIs(t, err, context.Canceled)
		},
		"stop during init cancels init": func(t *testing.T, p *probe) {
			inInit := make(chan struct{})
			startErr := make(chan error, 1)
			go func() {
				startErr <- p.start(t.Context(), func(ctx context.Context) error {
					close(inInit)
					<-ctx.Done()
					return context.Cause(ctx)
				})
			}()
			testenv.WaitChan(t, inInit, "init begins")
			require.NoError(t, p.svc.Stop(t.Context()))
			require.ErrorIs(t, testenv.WaitChan(t, startErr, "Start returns"), startstop.ErrStopped)
			require.Zero(t, p.runs)
		},
		"restart after stop": func(t *testing.T, p *probe) {
			require.NoError(t, p.start(t.Context(), nil))
			first := p.svc.Stopped()
			require.NoError(t, p.svc.Stop(t.Context()))
			require.NoError(t, p.start(t.Context(), nil))
			second := p.svc.Stopped()
			require.True(t, isClosed(first))
			require.False(t, isClosed(second), "a new run has a new stopped channel")
			require.NoError(t, p.svc.Stop(t.Context()))
			require.Equal(t, 2, p.runs)
		},
		"a run that returns on its own": func(t *testing.T, p *probe) {
			require.NoError(t, p.svc.Start(t.Context(), nil, func(context.Context) error { return errRun }))
			testenv.WaitChan(t, p.svc.Stopped(), "run returns")
			require.ErrorIs(t, p.svc.Stop(t.Context()), errRun)
			require.NoError(t, p.svc.Stop(t.Context()))
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tc(t, newProbe())
		})
	}
}
