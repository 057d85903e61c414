package outboxwire

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func insert(id string, ordering *string) *pgx.QueuedQuery {
	ex, rk, ct, idem := "ex", "rk", "application/json", "key-"+id
	h, body := []byte(`{}`), []byte(id)
	return &pgx.QueuedQuery{SQL: InsertSQL, Arguments: []any{&id, &ex, &rk, &h, &ct, &body, ordering, &idem}}
}

func TestMergeInserts_OneStatementWhereTheFirstWas(t *testing.T) {
	t.Parallel()
	claim := &pgx.QueuedQuery{SQL: "claim"}
	a, b := &pgx.QueuedQuery{SQL: "a"}, &pgx.QueuedQuery{SQL: "b"}
	k := "customer-1"
	withFn := insert("3", nil)
	withFn.Exec(func(pgconn.CommandTag) error { return nil })
	got := MergeInserts([]*pgx.QueuedQuery{claim, a, insert("1", &k), b, insert("2", nil), withFn})
	require.Len(t, got, 5)
	require.Equal(t, []*pgx.QueuedQuery{claim, a}, got[:2])
	require.Equal(t, insertManySQL, got[2].SQL)
	require.Equal(t, []*pgx.QueuedQuery{b, withFn}, got[3:], "the others keep their order; one with a callback is left alone")
	args := got[2].Arguments
	require.Equal(t, []string{"1", "2"}, args[0])
	require.Equal(t, []string{"ex", "ex"}, args[1])
	require.Equal(t, []string{"rk", "rk"}, args[2])
	require.Equal(t, []string{"{}", "{}"}, args[3])
	require.Equal(t, []string{"application/json", "application/json"}, args[4])
	require.Equal(t, [][]byte{[]byte("1"), []byte("2")}, args[5])
	require.Equal(t, []string{"customer-1", ""}, args[6], "none is empty, NULL in the table")
	require.Equal(t, []string{"key-1", "key-2"}, args[7])
}

func TestMergeInserts_LeavesAloneFewerThanTwo(t *testing.T) {
	t.Parallel()
	one := []*pgx.QueuedQuery{{SQL: "claim"}, insert("1", nil)}
	require.Equal(t, one, MergeInserts(one))
	odd := insert("2", nil)
	odd.Arguments[0] = "not a pointer"
	two := []*pgx.QueuedQuery{insert("1", nil), odd}
	require.Equal(t, two, MergeInserts(two), "an insert of another shape is not merged")
}
