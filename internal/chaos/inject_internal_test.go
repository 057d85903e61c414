package chaos

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// A connection listed for closing can end on its own just as rabbitmqctl
// reaches it (the worker reconnects, or closes a short-lived connection):
// that is no failure of the fault, which would fail the run, and no
// connection closed by it. Any other failure is one.
func TestCloseResult(t *testing.T) {
	t.Parallel()
	exit69 := errors.New("exit status 69")
	// What rabbitmqctl printed in a CI run when the connection's process
	// ended during the call.
	const noproc = `Error:
{:noproc, {:gen_server, :call, [#PID<12308.15325.38>, {:shutdown, "inboxmq chaos: injected connection loss"}, :infinity]}}
`
	closed, err := closeResult(nil, "")
	require.NoError(t, err)
	require.True(t, closed)

	closed, err = closeResult(exit69, noproc)
	require.NoError(t, err)
	require.False(t, closed)

	closed, err = closeResult(exit69, "Error: unable to perform an operation on node 'rabbit@host'")
	require.ErrorIs(t, err, exit69)
	require.ErrorContains(t, err, "unable to perform")
	require.False(t, closed)
}
