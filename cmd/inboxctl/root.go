package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/inboxmq/inboxmq/control"
	"github.com/inboxmq/inboxmq/inbox"
	"github.com/inboxmq/inboxmq/internal/amqpdial"
)

// Exit codes.
const (
	exitOK       = 0
	exitFailure  = 1
	exitUsage    = 2
	exitNotFound = 3
)

// cli holds the global flags and the output streams of one invocation.
type cli struct {
	out, errOut io.Writer
	getenv      func(string) string

	databaseURL string
	amqpURL     string
	output      string
	timeout     time.Duration
}

// usageError marks an error in the command line (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// notFoundError marks a missing object (exit 3).
type notFoundError struct{ err error }

func (e notFoundError) Error() string { return e.err.Error() }
func (e notFoundError) Unwrap() error { return e.err }

// run executes inboxctl with args and returns the exit code.
func run(ctx context.Context, args []string, out, errOut io.Writer, getenv func(string) string) int {
	c := &cli{out: out, errOut: errOut, getenv: getenv}
	root := c.rootCmd()
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(errOut)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(errOut, "inboxctl: "+c.redact(err.Error()))
	var ue usageError
	var nf notFoundError
	switch {
	case errors.As(err, &nf):
		return exitNotFound
	case errors.As(err, &ue), errors.Is(err, control.ErrInvalid), isCobraUsage(err):
		return exitUsage
	default:
		return exitFailure
	}
}

// isCobraUsage recognises cobra's own argument and flag errors.
func isCobraUsage(err error) bool {
	s := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "invalid argument \"", "flag needs an argument", "required flag"} {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

func (c *cli) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "inboxctl",
		Short: "Operate inboxmq: inbox, dead letters, retention and runtime controls",
		Long: `inboxctl operates an inboxmq deployment.

Connection settings come from --database-url (or DATABASE_URL) and
--amqp-url (or AMQP_URL); credentials are never printed. Use --output json
in scripts. Exit codes: 0 success, 1 failure, 2 usage error, 3 not found.

Runtime controls (pause, resume, concurrency, block, unblock) are stored in
PostgreSQL; running workers pick them up within 2 seconds, unless their
controls are off. Each change says how many live workers obey it; workers
lists them.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if c.output != "text" && c.output != "json" {
				return usagef("--output must be text or json, not %q", c.output)
			}
			return nil
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	pf := root.PersistentFlags()
	pf.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL)")
	pf.StringVar(&c.amqpURL, "amqp-url", "", "RabbitMQ URL, or a cluster's node URLs separated by commas (default $AMQP_URL)")
	pf.StringVarP(&c.output, "output", "o", "text", "output format: text or json")
	pf.DurationVar(&c.timeout, "timeout", 5*time.Minute, "overall time limit of the command")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })

	root.AddCommand(
		c.migrateCmd(), c.partitionCmd(), c.statusCmd(), c.staleCmd(), c.reconcileCmd(), c.statsCmd(), c.purgeCmd(),
		c.dlqCmd(),
		c.pauseCmd(), c.resumeCmd(), c.concurrencyCmd(), c.blockCmd(), c.unblockCmd(), c.controlsCmd(), c.workersCmd(),
		c.orderedCmd(), c.lintCmd(), c.uiCmd(),
	)
	root.AddCommand(c.versionCmd())
	return root
}

// ctx bounds a command by --timeout.
func (c *cli) ctx(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), c.timeout)
}

func (c *cli) dbURL() (string, error) {
	u := c.databaseURL
	if u == "" {
		u = c.getenv("DATABASE_URL")
	}
	if u == "" {
		return "", usagef("no database: set --database-url or DATABASE_URL")
	}
	return u, nil
}

func (c *cli) brokerURL() (string, error) {
	u := c.amqpURL
	if u == "" {
		u = c.getenv("AMQP_URL")
	}
	if u == "" {
		return "", usagef("no broker: set --amqp-url or AMQP_URL")
	}
	return u, nil
}

// openDB opens a small pool on the database.
func (c *cli) openDB(ctx context.Context) (*pgxpool.Pool, error) {
	u, err := c.dbURL()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["application_name"] = "inboxctl"
	if err := inbox.ConfigurePool(cfg); err != nil { // the primary only, as the workers
		return nil, fmt.Errorf("database %s: %w", redactURL(u), err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database %s: %w", redactURL(u), err)
	}
	return pool, nil
}

// dbFor opens the database for cmd, bounded by --timeout; done closes
// the pool and ends the bound.
func (c *cli) dbFor(cmd *cobra.Command) (ctx context.Context, pool *pgxpool.Pool, done func(), err error) {
	ctx, cancel := c.ctx(cmd)
	pool, err = c.openDB(ctx)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, pool, func() { pool.Close(); cancel() }, nil
}

// storeFor opens the database and the inbox store on it for cmd, as
// dbFor.
func (c *cli) storeFor(cmd *cobra.Command) (ctx context.Context, s *inbox.Store, done func(), err error) {
	ctx, pool, done, err := c.dbFor(cmd)
	if err != nil {
		return nil, nil, nil, err
	}
	s, err = inbox.NewStore(pool, nil)
	if err == nil {
		err = s.Check(ctx)
	}
	if err != nil {
		done()
		return nil, nil, nil, err
	}
	return ctx, s, done, nil
}

// dialBroker connects to RabbitMQ: to one node that answers when the URL
// lists a cluster's nodes.
func (c *cli) dialBroker() (*amqp.Connection, error) {
	u, err := c.brokerURL()
	if err != nil {
		return nil, err
	}
	d, err := amqpdial.New(amqpdial.Config{URL: u})
	if err != nil {
		return nil, usagef("--amqp-url / AMQP_URL: %v", err)
	}
	conn, _, err := d.Dial(context.Background(), "inboxctl", amqpdial.RoleAdmin)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	return conn, nil
}

// redact removes the passwords of the configured URLs from s.
func (c *cli) redact(s string) string {
	raws := []string{c.databaseURL, c.getenv("DATABASE_URL"), c.amqpURL, c.getenv("AMQP_URL")}
	for _, list := range raws[2:] {
		if nodes, err := amqpdial.Parse(list); err == nil && len(nodes) > 1 {
			for _, n := range nodes {
				raws = append(raws, n.URL) // each node's password
			}
		}
	}
	for _, raw := range raws {
		if raw == "" {
			continue
		}
		s = strings.ReplaceAll(s, raw, redactURL(raw))
		if u, err := url.Parse(raw); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok && p != "" {
				s = strings.ReplaceAll(s, p, "xxxxx")
			}
		}
	}
	return s
}

// redactURL hides the password of a URL (and of key=value DSNs).
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		if strings.Contains(raw, "password=") {
			return "<dsn with password>"
		}
		return raw
	}
	return u.Redacted()
}

// actor names the operator for updated_by columns: $USER@host.
func (c *cli) actor() string {
	name := c.getenv("USER")
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	host, _ := os.Hostname()
	return "inboxctl:" + name + "@" + host
}

// intFlagAtLeast refuses an integer flag below lowest with a usage error
// naming the flag and what its values mean.
func intFlagAtLeast(flag string, v, lowest int, meaning string) error {
	if v < lowest {
		return usagef("--%s %d: %s", flag, v, meaning)
	}
	return nil
}

// emit writes v as JSON (--output json) or calls text.
func (c *cli) emit(v any, text func(w io.Writer)) error {
	if c.output == "json" {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	text(c.out)
	return nil
}
