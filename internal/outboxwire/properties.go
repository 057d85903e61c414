package outboxwire

import (
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// properties are the AMQP properties of a whole message carried by an
// outbox row (its properties column) that the other columns do not hold.
type properties struct {
	MessageID       string     `json:"message_id,omitempty"`
	CorrelationID   string     `json:"correlation_id,omitempty"`
	ReplyTo         string     `json:"reply_to,omitempty"`
	Type            string     `json:"type,omitempty"`
	AppID           string     `json:"app_id,omitempty"`
	ContentEncoding string     `json:"content_encoding,omitempty"`
	Priority        uint8      `json:"priority,omitempty"`
	DeliveryMode    uint8      `json:"delivery_mode,omitempty"`
	Timestamp       *time.Time `json:"timestamp,omitempty"`
}

// EncodeProperties encodes m's properties for an outbox row's properties
// column: a message written whole (a scheduled retry, a released held
// message) goes out with them, not with the relay's own.
func EncodeProperties(m *amqp.Publishing) ([]byte, error) {
	p := properties{
		MessageID: m.MessageId, CorrelationID: m.CorrelationId, ReplyTo: m.ReplyTo, Type: m.Type, AppID: m.AppId,
		ContentEncoding: m.ContentEncoding, Priority: m.Priority, DeliveryMode: m.DeliveryMode,
	}
	if !m.Timestamp.IsZero() {
		ts := m.Timestamp
		p.Timestamp = &ts
	}
	return json.Marshal(p)
}

// DecodeProperties sets pub's properties from a row's: the message is
// published as it was written, with no property of the relay's own.
func DecodeProperties(b []byte, pub *amqp.Publishing) error {
	var p properties
	if err := json.Unmarshal(b, &p); err != nil {
		return fmt.Errorf("properties: %w", err)
	}
	pub.MessageId, pub.CorrelationId, pub.ReplyTo, pub.Type, pub.AppId = p.MessageID, p.CorrelationID, p.ReplyTo, p.Type, p.AppID
	pub.ContentEncoding, pub.Priority = p.ContentEncoding, p.Priority
	if p.DeliveryMode != 0 {
		pub.DeliveryMode = p.DeliveryMode
	}
	pub.Timestamp = time.Time{}
	if p.Timestamp != nil {
		pub.Timestamp = *p.Timestamp
	}
	return nil
}
