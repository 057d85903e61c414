package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/inboxmq/inboxmq/internal/pgserver"
)

// pgServer is a PostgreSQL server of the run's own, so that the
// pg-restart fault never touches a server the run did not start.
type pgServer struct {
	*pgserver.Server
}

// pgStopWait bounds a fast shutdown before the server is killed.
const pgStopWait = 10 * time.Second

// startPGServer creates and starts the run's server: enough connections
// for the workers' pools and the run's checks.
func startPGServer(ctx context.Context) (*pgServer, error) {
	bin, err := pgserver.Binaries()
	if err != nil {
		return nil, fmt.Errorf("chaos: the pg-restart fault runs a PostgreSQL server of its own: %w "+
			"(Debian/Ubuntu: apt-get install postgresql; or set PG_BINDIR to the folder of initdb)", err)
	}
	srv, err := pgserver.New(bin)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	s := &pgServer{srv}
	if err := srv.Init("max_connections = 300"); err != nil {
		s.remove()
		return nil, fmt.Errorf("chaos: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := srv.Start(sctx); err != nil {
		s.remove()
		return nil, fmt.Errorf("chaos: %w", err)
	}
	return s, nil
}

func (s *pgServer) remove() { s.Remove(pgStopWait) }

// restart is the pg-restart fault: a fast shutdown (every session ends
// with 57P01), down for down, then the server starts again with its data.
func (s *pgServer) restart(ctx context.Context, down time.Duration) error {
	s.Stop(pgStopWait)
	t := time.NewTimer(down)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	// Always start it again, even if ctx ended: the workers use it.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	return s.Start(sctx)
}
