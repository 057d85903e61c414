package consumer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inboxmq/inboxmq/internal/testenv"
)

// fakeBroker is a channel's settlement side as RabbitMQ keeps it: the
// unsettled tags, and what each frame settled. Settling a tag twice is the
// broker's PRECONDITION_FAILED (unknown delivery tag), which closes the
// channel.
type fakeBroker struct {
	mu        sync.Mutex
	unsettled map[uint64]bool
	acked     map[uint64]bool
	requeued  map[uint64]bool
	rejected  map[uint64]bool
	frames    []string
	gate      chan struct{} // when set, the first frame waits for it
	entered   chan struct{}
	// With holdGate set, the frame naming holdTag signals holdEntered and
	// waits for holdGate.
	holdTag     uint64
	holdGate    chan struct{}
	holdEntered chan struct{}
}

func newFakeBroker() *fakeBroker {
	return &fakeBroker{
		unsettled: map[uint64]bool{}, acked: map[uint64]bool{},
		requeued: map[uint64]bool{}, rejected: map[uint64]bool{},
	}
}

func (b *fakeBroker) deliver(a *acker, tags ...uint64) {
	b.mu.Lock()
	for _, t := range tags {
		b.unsettled[t] = true
	}
	b.mu.Unlock()
	for _, t := range tags {
		a.track(t)
	}
}

func (b *fakeBroker) hold() {
	b.gate, b.entered = make(chan struct{}), make(chan struct{})
}

func (b *fakeBroker) wait() {
	if b.gate == nil {
		return
	}
	select {
	case <-b.entered:
		return // not the first frame
	default:
	}
	close(b.entered)
	<-b.gate
}

func (b *fakeBroker) Ack(tag uint64, multiple bool) error {
	b.wait()
	if b.holdGate != nil && tag == b.holdTag {
		close(b.holdEntered)
		<-b.holdGate
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frames = append(b.frames, fmt.Sprintf("ack %d multiple=%v", tag, multiple))
	if !multiple || !b.unsettled[tag] {
		return b.settle(tag, b.acked) // a multiple ack must name an unsettled tag too
	}
	for t := range b.unsettled {
		if t <= tag {
			if err := b.settle(t, b.acked); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *fakeBroker) Nack(tag uint64, multiple, requeue bool) error {
	b.wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	if multiple {
		return errors.New("fake: nack multiple is never sent")
	}
	b.frames = append(b.frames, fmt.Sprintf("nack %d requeue=%v", tag, requeue))
	if requeue {
		return b.settle(tag, b.requeued)
	}
	return b.settle(tag, b.rejected)
}

func (b *fakeBroker) settle(tag uint64, into map[uint64]bool) error {
	if !b.unsettled[tag] {
		return fmt.Errorf("fake: PRECONDITION_FAILED unknown delivery tag %d", tag)
	}
	delete(b.unsettled, tag)
	into[tag] = true
	return nil
}

// settleQueued settles each tag with op from its own goroutine while the
// broker holds the first frame (sent by first), so that they all land in
// the combiner's next round.
func settleQueued(t *testing.T, a *acker, b *fakeBroker, first uint64, rest map[uint64]ackOp) {
	t.Helper()
	b.hold()
	var wg sync.WaitGroup
	errs := make(chan error, len(rest)+1)
	wg.Add(1)
	go func() { defer wg.Done(); errs <- a.settle(first, opAck) }()
	testenv.WaitChan(t, b.entered, "first frame sent")
	for tag, op := range rest {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- a.settle(tag, op) }()
	}
	testenv.WaitFor(t, "requests queued behind the combiner", func() bool { return a.queued() == len(rest) })
	close(b.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func TestAcker_RunAtTheHeadIsOneMultipleAck(t *testing.T) {
	t.Parallel()
	b := newFakeBroker()
	var st ackStats
	a := newAcker(b, &st)
	b.deliver(a, 1, 2, 3, 4, 5, 6)
	// 1 is being written; 2, 3, 4 are acked and 6 requeued meanwhile; 5 is
	// still running.
	settleQueued(t, a, b, 1, map[uint64]ackOp{2: opAck, 3: opAck, 4: opAck, 6: opRequeue})
	require.Equal(t, []string{"ack 1 multiple=false", "nack 6 requeue=true", "ack 4 multiple=true"}, b.frames)
	require.Equal(t, map[uint64]bool{5: true}, b.unsettled, "the running delivery is not acked")
	require.NoError(t, a.settle(5, opAck))
	require.Empty(t, b.unsettled)
	require.Equal(t, uint64(4), st.frames.Load())
	require.Equal(t, uint64(6), st.settled.Load())
}

// The caller that writes a round returns once its own frame is written:
// the next round, for the requests that queued meanwhile, is written by
// one of their callers (it is held here, and the first caller is back).
func TestAcker_WriterWritesOneRoundAndHandsOn(t *testing.T) {
	t.Parallel()
	b := newFakeBroker()
	a := newAcker(b, nil)
	b.deliver(a, 1, 2, 3)
	b.holdTag, b.holdGate, b.holdEntered = 3, make(chan struct{}), make(chan struct{})
	b.hold()
	firstDone := make(chan error, 1)
	go func() { firstDone <- a.settle(1, opAck) }()
	testenv.WaitChan(t, b.entered, "first frame being written")
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, tag := range []uint64{2, 3} {
		wg.Go(func() { errs[i] = a.settle(tag, opAck) })
	}
	testenv.WaitFor(t, "two requests queued", func() bool { return a.queued() == 2 })
	close(b.gate)
	require.NoError(t, testenv.WaitChan(t, firstDone, "the first caller is back while the next round is held"))
	testenv.WaitChan(t, b.holdEntered, "the next round, written by a waiter")
	close(b.holdGate)
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, []string{"ack 1 multiple=false", "ack 3 multiple=true"}, b.frames)
}

func TestAcker_AcksAboveAnUnsettledDeliveryGoSingly(t *testing.T) {
	t.Parallel()
	b := newFakeBroker()
	a := newAcker(b, nil)
	b.deliver(a, 1, 2, 3, 4)
	// 2 is still running: a multiple ack of 4 would ack it.
	settleQueued(t, a, b, 1, map[uint64]ackOp{3: opAck, 4: opAck})
	require.Equal(t, []string{"ack 1 multiple=false", "ack 3 multiple=false", "ack 4 multiple=false"}, b.frames)
	require.Equal(t, map[uint64]bool{2: true}, b.unsettled)
}

func TestAcker_RunSpansDeliveriesSettledEarlier(t *testing.T) {
	t.Parallel()
	b := newFakeBroker()
	a := newAcker(b, nil)
	b.deliver(a, 1, 2, 3, 4, 5, 6)
	// 3 is acked first, on its own; then 1, 2, 4, 5 together: one multiple
	// ack covers them (3 is settled already), and 6 still runs.
	settleQueued(t, a, b, 3, map[uint64]ackOp{1: opAck, 2: opAck, 4: opAck, 5: opAck})
	require.Equal(t, []string{"ack 3 multiple=false", "ack 5 multiple=true"}, b.frames)
	require.Equal(t, map[uint64]bool{6: true}, b.unsettled)
}

func TestAcker_NackBelowTheRunGoesFirst(t *testing.T) {
	t.Parallel()
	b := newFakeBroker()
	a := newAcker(b, nil)
	b.deliver(a, 1, 2, 3, 4)
	// 2 is rejected in the same round in which 3 and 4 are acked: the
	// reject must be written before a multiple ack could cover it.
	settleQueued(t, a, b, 1, map[uint64]ackOp{2: opReject, 3: opAck, 4: opAck})
	require.Equal(t, []string{"ack 1 multiple=false", "nack 2 requeue=false", "ack 4 multiple=true"}, b.frames)
	require.Equal(t, map[uint64]bool{2: true}, b.rejected)
	require.Equal(t, map[uint64]bool{1: true, 3: true, 4: true}, b.acked)
}

// A delivery that runs for long holds the head of the window while
// thousands after it are settled: the window stays bounded, and the long
// one is still acked alone at the end, with nothing acked twice.
func TestAcker_LongRunningDeliveryKeepsTheWindowBounded(t *testing.T) {
	t.Parallel()
	b := newFakeBroker()
	a := newAcker(b, nil)
	const n = 20000
	b.deliver(a, 1)
	for tag := uint64(2); tag <= n; tag++ {
		b.deliver(a, tag)
		require.NoError(t, a.settle(tag, opAck))
	}
	a.mu.Lock()
	size := len(a.window) - a.head
	a.mu.Unlock()
	require.LessOrEqual(t, size, maxSentInWindow+1)
	require.Equal(t, map[uint64]bool{1: true}, b.unsettled)
	require.NoError(t, a.settle(1, opAck))
	require.Empty(t, b.unsettled)
}

// Random settlement orders from many goroutines, as a pool of workers
// makes them, while a delivery loop keeps tracking new tags: every delivery
// is settled once, as its worker asked — never acked by another's multiple
// ack while it still runs, never twice. One round is long enough for the
// window's compaction.
func TestAcker_ConcurrentSettlementsSettleEachDeliveryAsAsked(t *testing.T) {
	t.Parallel()
	multiples := 0
	for round := range 40 {
		b := newFakeBroker()
		a := newAcker(b, nil)
		n := 400
		if round == 0 {
			n = 3 * maxSentInWindow
		}
		want := make(map[uint64]ackOp, n)
		for tag := uint64(1); tag <= uint64(n); tag++ {
			op := opAck
			switch rand.IntN(10) {
			case 0:
				op = opRequeue
			case 1:
				op = opReject
			}
			want[tag] = op
		}
		work := make(chan uint64, 32) // the prefetch
		go func() {                   // the delivery loop
			for tag := uint64(1); tag <= uint64(n); tag++ {
				b.deliver(a, tag)
				work <- tag
			}
			close(work)
		}()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range 16 {
			wg.Go(func() {
				var held []uint64 // settled later, out of order
				for tag := range work {
					held = append(held, tag)
					if round%2 == 0 && rand.IntN(2) == 0 && len(held) < 4 {
						continue
					}
					i := rand.IntN(len(held))
					errs <- a.settle(held[i], want[held[i]])
					held = slices.Delete(held, i, i+1)
				}
				for _, tag := range held {
					errs <- a.settle(tag, want[tag])
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err, "round %d", round)
		}
		require.Empty(t, b.unsettled, "round %d", round)
		for tag, op := range want {
			switch op {
			case opAck:
				require.True(t, b.acked[tag], "round %d: tag %d acked", round, tag)
			case opRequeue:
				require.True(t, b.requeued[tag], "round %d: tag %d requeued", round, tag)
			case opReject:
				require.True(t, b.rejected[tag], "round %d: tag %d rejected", round, tag)
			}
		}
		for _, f := range b.frames {
			if strings.HasSuffix(f, "multiple=true") {
				multiples++
			}
		}
	}
	require.Positive(t, multiples, "some runs were coalesced")
}
