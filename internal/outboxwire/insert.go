package outboxwire

import "github.com/jackc/pgx/v5"

// InsertSQL writes one outbox row. Package outbox queues it with the row's
// columns as pointers, in the statement's order: message id, exchange and
// routing key (*string), headers (*[]byte), content type (*string), body
// (*[]byte), ordering key and idempotency key (*string, nil for none).
// MergeInserts relies on that shape.
const InsertSQL = `INSERT INTO inboxmq_outbox
	(message_id, exchange, routing_key, headers, content_type, body, ordering_key, idempotency_key)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (message_id) DO NOTHING`

// insertManySQL is InsertSQL for many rows, one array per column, in array
// order (the identity column follows it, and with it a key's order). An
// empty ordering or idempotency key is none, as in package outbox.
const insertManySQL = `INSERT INTO inboxmq_outbox
	(message_id, exchange, routing_key, headers, content_type, body, ordering_key, idempotency_key)
SELECT m, e, r, h::jsonb, c, b, NULLIF(o, ''), NULLIF(k, '')
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::text[]) AS u(m, e, r, h, c, b, o, k)
ON CONFLICT (message_id) DO NOTHING`

// MergeInserts returns qs with its outbox inserts (InsertSQL, queued by
// package outbox) written by one statement, where the first of them was;
// the other queries keep their order. A group commit sends the writes of
// many deliveries in one batch, and each delivery's event would otherwise
// be a statement of its own, for PostgreSQL to bind and execute. qs is
// changed in place. With fewer than two inserts it is returned as it is.
func MergeInserts(qs []*pgx.QueuedQuery) []*pgx.QueuedQuery {
	n := 0
	for _, q := range qs {
		if _, ok := insertRow(q); ok {
			n++
		}
	}
	if n < 2 {
		return qs
	}
	var (
		ids, exchanges, keys, headers, types, orderings, idems = make([]string, 0, n), make([]string, 0, n),
			make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		bodies = make([][]byte, 0, n)
	)
	out, at := qs[:0], -1
	for _, q := range qs {
		r, ok := insertRow(q)
		if !ok {
			out = append(out, q)
			continue
		}
		ids, exchanges, keys = append(ids, *r.id), append(exchanges, *r.exchange), append(keys, *r.routingKey)
		headers, types, bodies = append(headers, string(*r.headers)), append(types, *r.contentType), append(bodies, *r.body)
		orderings, idems = append(orderings, deref(r.orderingKey)), append(idems, deref(r.idempotencyKey))
		if at < 0 {
			at = len(out)
			out = append(out, nil)
		}
	}
	out[at] = &pgx.QueuedQuery{SQL: insertManySQL, Arguments: []any{ids, exchanges, keys, headers, types, bodies, orderings, idems}}
	return out
}

// insertArgs are the arguments of one InsertSQL.
type insertArgs struct {
	id, exchange, routingKey, contentType *string
	headers, body                         *[]byte
	orderingKey, idempotencyKey           *string
}

// insertRow reads q's arguments if it is an outbox insert of the shape
// InsertSQL documents, with no callback of its own.
func insertRow(q *pgx.QueuedQuery) (insertArgs, bool) {
	if q.SQL != InsertSQL || q.Fn != nil || len(q.Arguments) != 8 {
		return insertArgs{}, false
	}
	var r insertArgs
	var ok [8]bool
	r.id, ok[0] = q.Arguments[0].(*string)
	r.exchange, ok[1] = q.Arguments[1].(*string)
	r.routingKey, ok[2] = q.Arguments[2].(*string)
	r.headers, ok[3] = q.Arguments[3].(*[]byte)
	r.contentType, ok[4] = q.Arguments[4].(*string)
	r.body, ok[5] = q.Arguments[5].(*[]byte)
	r.orderingKey, ok[6] = q.Arguments[6].(*string)
	r.idempotencyKey, ok[7] = q.Arguments[7].(*string)
	for _, o := range ok {
		if !o {
			return insertArgs{}, false
		}
	}
	if r.id == nil || r.exchange == nil || r.routingKey == nil || r.headers == nil || r.contentType == nil || r.body == nil {
		return insertArgs{}, false
	}
	return r, true
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
