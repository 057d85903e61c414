package envelope

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inboxmq/inboxmq/inboxtype"
)

// Copy returns the persistent copy of d that inboxmq publishes when it
// moves a delivery on (a retry or dead-letter copy, a replayed dead
// letter, a parked or released message): d's body, message id, content
// type and encoding, correlation id, reply-to, priority, timestamp, type
// and app id, and d's headers as edit leaves them.
//
// edit gets a copy of d's headers that it may change (d's own stay as they
// are), without the broker's x-delivery-count, which counts the deliveries
// of one queue and means nothing in another. A nil edit keeps the copy's
// headers. The expiration and the user id are not copied: a copy does not
// expire again, and the broker checks a user id against the publishing
// connection's user.
func Copy(d *amqp.Delivery, edit func(h amqp.Table)) amqp.Publishing {
	h := make(amqp.Table, len(d.Headers)+8) // room for the failure headers
	for k, v := range d.Headers {
		if k != inboxtype.HeaderDeliveryCount {
			h[k] = v
		}
	}
	if edit != nil {
		edit(h)
	}
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
