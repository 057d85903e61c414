package retry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/retry"
)

type selfDeciding struct{ retryable bool }

func (e selfDeciding) Error() string   { return "self-deciding" }
func (e selfDeciding) Retryable() bool { return e.retryable }

func TestClassify(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	tests := []struct {
		name   string
		err    error
		kind   retry.Kind
		reason string
		source string
		delay  time.Duration
	}{
		{"nil", nil, retry.KindSucceeded, "", "", 0},
		{"plain error", boom, retry.KindRetry, retry.ReasonError, "", 0},
		{"wrapped plain", fmt.Errorf("ctx: %w", boom), retry.KindRetry, retry.ReasonError, "", 0},
		{"sentinel duplicate", retry.ErrDuplicate, retry.KindDuplicate, "duplicate", retry.SourceInbox, 0},
		{"wrapped sentinel duplicate", fmt.Errorf("x: %w", retry.ErrDuplicate), retry.KindDuplicate, "duplicate", retry.SourceInbox, 0},
		{"duplicate with source", retry.Duplicate(retry.SourceCache, nil), retry.KindDuplicate, "duplicate", retry.SourceCache, 0},
		{"business duplicate", retry.Duplicate(retry.SourceBusiness, boom), retry.KindDuplicate, "duplicate", retry.SourceBusiness, 0},
		{"key conflict", fmt.Errorf("k: %w", retry.ErrKeyConflict), retry.KindPermanent, retry.ReasonKeyConflict, "", 0},
		{"permanent", retry.Permanent(boom), retry.KindPermanent, retry.ReasonPermanent, "", 0},
		{"permanent nil", retry.Permanent(nil), retry.KindPermanent, retry.ReasonPermanent, "", 0},
		{"permanent with reason", retry.Permanent(retry.WithReason(retry.ReasonDecode, boom)), retry.KindPermanent, retry.ReasonDecode, "", 0},
		{"reason outside permanent", retry.WithReason("gateway_4xx", retry.Permanent(boom)), retry.KindPermanent, "gateway_4xx", "", 0},
		{"after", retry.After(3*time.Second, boom), retry.KindRetry, retry.ReasonRequested, "", 3 * time.Second},
		{"retryable", retry.Retryable(boom), retry.KindRetry, retry.ReasonRequested, "", 0},
		{"after with reason", retry.WithReason("gateway_5xx", retry.After(time.Second, boom)), retry.KindRetry, "gateway_5xx", "", time.Second},
		{"defer", retry.Defer(time.Second, boom), retry.KindRetry, retry.ReasonRequested, "", time.Second},
		{"interrupted", retry.Interrupted(boom), retry.KindInterrupted, "interrupted", "", 0},
		{"behaviour retryable", fmt.Errorf("w: %w", selfDeciding{true}), retry.KindRetry, retry.ReasonError, "", 0},
		{"behaviour permanent", selfDeciding{false}, retry.KindPermanent, retry.ReasonPermanent, "", 0},
		{"deadline", fmt.Errorf("q: %w", context.DeadlineExceeded), retry.KindRetry, retry.ReasonTimeout, "", 0},
		{"joined keeps permanent", errors.Join(boom, retry.Permanent(boom)), retry.KindPermanent, retry.ReasonPermanent, "", 0},
		{"interrupted beats permanent", errors.Join(retry.Permanent(boom), retry.Interrupted(boom)), retry.KindInterrupted, "interrupted", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := retry.Classify(tt.err)
			require.Equal(t, tt.kind, d.Kind, "kind")
			require.Equal(t, tt.reason, d.Reason, "reason")
			require.Equal(t, tt.source, d.Source, "source")
			require.Equal(t, tt.delay, d.Delay, "delay")
			if tt.err != nil {
				require.ErrorIs(t, d.Err, tt.err)
			}
		})
	}
}

func TestClassifyRules(t *testing.T) {
	t.Parallel()
	errNotFound := errors.New("not found")
	rule := func(err error) (retry.Decision, bool) {
		if errors.Is(err, errNotFound) {
			return retry.Decision{Kind: retry.KindPermanent, Reason: "not_found"}, true
		}
		return retry.Decision{}, false
	}
	d := retry.Classify(fmt.Errorf("load: %w", errNotFound), nil, rule)
	require.Equal(t, retry.KindPermanent, d.Kind)
	require.Equal(t, "not_found", d.Reason)
	require.ErrorIs(t, d.Err, errNotFound)

	// A rule that passes leaves the built-in taxonomy in charge.
	d = retry.Classify(retry.ErrDuplicate, rule)
	require.Equal(t, retry.KindDuplicate, d.Kind)

	// A rule without a reason gets the error's reason or the kind's default.
	anyRetry := func(error) (retry.Decision, bool) { return retry.Decision{Kind: retry.KindRetry}, true }
	require.Equal(t, retry.ReasonError, retry.Classify(errNotFound, anyRetry).Reason)
	require.Equal(t, "r", retry.Classify(retry.WithReason("r", errNotFound), anyRetry).Reason)
}

func TestDeferIsUncounted(t *testing.T) {
	t.Parallel()
	require.True(t, retry.Classify(retry.WithReason("lock_unavailable", retry.Defer(time.Second, nil))).Uncounted)
	require.False(t, retry.Classify(retry.After(time.Second, nil)).Uncounted)
	require.ErrorIs(t, retry.Defer(0, nil), &retry.RetryableError{})
}

func TestErrorsMatchAnyInstance(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	require.ErrorIs(t, retry.Permanent(boom), &retry.PermanentError{})
	require.ErrorIs(t, retry.After(time.Second, boom), &retry.RetryableError{})
	require.ErrorIs(t, retry.Interrupted(boom), &retry.InterruptedError{})
	require.ErrorIs(t, retry.Duplicate(retry.SourceCache, nil), retry.ErrDuplicate)
	require.ErrorIs(t, retry.Duplicate(retry.SourceCache, nil), &retry.DuplicateError{})
	require.ErrorIs(t, retry.Permanent(boom), boom)
	require.NotErrorIs(t, retry.Permanent(boom), &retry.RetryableError{})
	require.NoError(t, retry.WithReason("x", nil))
	require.Contains(t, retry.Duplicate(retry.SourceFenced, boom).Error(), "fenced")
}

func TestKindString(t *testing.T) {
	t.Parallel()
	for k, s := range map[retry.Kind]string{
		retry.KindSucceeded: "succeeded", retry.KindDuplicate: "duplicate", retry.KindRetry: "retry",
		retry.KindPermanent: "permanent", retry.KindInterrupted: "interrupted", retry.Kind(99): "unknown",
	} {
		require.Equal(t, s, k.String())
	}
}
