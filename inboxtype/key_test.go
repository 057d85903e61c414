package inboxtype_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/inboxtype"
)

func TestValidKey_InvalidUTF8(t *testing.T) {
	t.Parallel()
	// A codec other than JSON may hand over bytes as they are.
	require.ErrorContains(t, inboxtype.ValidKey("k\xff"), "UTF-8")
	require.NoError(t, inboxtype.ValidKey("k"))
}
