package consumer

// SetTestHooks arms the fault-injection hooks of c (before Start). Either
// function may be nil.
func SetTestHooks(c *Consumer, beforeAck, afterPublish func(d *Delivery)) {
	c.hooks.Store(&testHooks{beforeAck: beforeAck, afterPublish: afterPublish})
}

// SetAckRoundHook arms the acker hook of c (before Start): it runs before
// each round of settlement frames with a count of the requests queued.
func SetAckRoundHook(c *Consumer, hook func(queued func() int)) {
	h := &testHooks{}
	if old := c.hooks.Load(); old != nil {
		*h = *old
	}
	h.beforeAckRound = hook
	c.hooks.Store(h)
}

// AckStats reports the settlement frames c wrote and the deliveries they
// settled.
func AckStats(c *Consumer) (frames, settled uint64) {
	return c.acks.frames.Load(), c.acks.settled.Load()
}
