// Package inboxmq is the root of the inboxmq module: a framework for
// RabbitMQ worker binaries in which a duplicate delivery never causes a
// duplicate effect.
//
// For now it only names the release ([Version]). The framework itself lives
// in the packages below it: consumer (the AMQP runtime and the router),
// inbox (the PostgreSQL inbox), retry (the error classifier), middleware,
// lock, outbox and metrics. The README and docs/guarantees.md say what is
// guaranteed and which test proves it.
package inboxmq
