package consumer

// SetTestHooks arms the fault-injection hooks of c (before Start). Either
// function may be nil.
func SetTestHooks(c *Consumer, beforeAck, afterPublish func(d *Delivery)) {
	c.hooks.Store(&testHooks{beforeAck: beforeAck, afterPublish: afterPublish})
}
