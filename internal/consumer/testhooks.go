package consumer

import "github.com/inboxmq/inboxmq/inboxtype"

// testHooks are fault-injection points for tests (river's testsignal
// style). A nil *testHooks, and every nil field, does nothing. Tests set
// them before Start through export_test.go.
type testHooks struct {
	// beforeAck runs after a handler succeeded (its effect is committed)
	// and before the delivery is acked.
	beforeAck func(d *inboxtype.Delivery)
	// afterPublish runs after a retry or dead-letter copy was confirmed and
	// before the original is acked.
	afterPublish func(d *inboxtype.Delivery)
	// beforeAckRound runs in a channel's acker before each round of
	// settlement frames, with a function counting the requests queued.
	beforeAckRound func(queued func() int)
}

func (h *testHooks) runBeforeAck(d *inboxtype.Delivery) {
	if h != nil && h.beforeAck != nil {
		h.beforeAck(d)
	}
}

func (h *testHooks) runAfterPublish(d *inboxtype.Delivery) {
	if h != nil && h.afterPublish != nil {
		h.afterPublish(d)
	}
}
