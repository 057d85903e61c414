// Package metrics is inboxmq's one registry-facing place: every layer (the
// consumer runtime, the Redis lock and completed-cache, the inbox reconciler)
// reports to a single [Metrics], which owns the Prometheus series, their
// names and their bounded label values. Keeping them here, rather than
// spread over the packages that cause the events, gives one list of series
// to document, alert on and chart, one place that pre-initialises every
// label value, and no import of Prometheus in the packages that only need
// to report (they call the [inboxtype.Observer] methods or a small hook).
//
// # Wiring
//
// Build the series once, register them with your registry, initialise each
// route so that a quiet system shows zeros, and give the *Metrics to the
// consumer as one of its observers (*Metrics implements [inboxtype.Observer]):
//
//	m, err := metrics.New(reg, &metrics.Config{Inbox: &metrics.InboxConfig{DB: pool}})
//	if err != nil {
//		return err
//	}
//	m.Init("payments", "payments")
//
// The worker gives each Redis user (the cache, the lock, the rate limit) a
// hook from [Metrics.RedisDegradedHook]; the reconciler calls
// [Metrics.StaleRecords].
//
// # Series
//
// Every name carries the namespace prefix (Config.Namespace, "inboxmq" by
// default). Labels are bounded: queue and consumer come from the router's
// registrations, reason, source, kind, outcome and action from fixed lists.
// An idempotency key or message id is never a label.
//
//   - deliveries_received_total{queue,consumer}, redelivered_total{queue,consumer}
//   - deliveries_settled_total{queue,consumer,action}, settle_errors_total{queue,consumer,action}
//   - in_flight{queue,consumer}
//   - job_processing_duration_seconds{queue,consumer,outcome} (histogram, receipt to settlement)
//   - handler_duration_seconds{queue,consumer,kind} (histogram, the last run of the chain and handler of each settled delivery, from Outcome.Handled)
//   - duplicate_detected_total{queue,consumer,source}
//   - idempotency_conflict_total{queue,consumer,kind}
//   - job_retry_total{queue,consumer,reason}, in_process_retry_total{queue,consumer,reason}
//   - dead_lettered_total{queue,consumer,reason}
//   - lock_acquire_success_total, lock_acquire_failed_total, lock_expired_before_completion_total {queue,consumer}
//   - stale_processing_records_total{consumer}
//   - redis_degraded, broker_connected, broker_reconnects_total
//   - with Config.Inbox: inbox_rows{consumer,status}, oldest_processing_claim_age_seconds{consumer},
//     inbox_expired_claims{consumer}, inbox_scrape_success
//
// # Counting rules
//
// Each delivery is counted once per event: a duplicate, a broker-side retry
// and a dead letter are counted from the delivery's Outcome, not from its
// status transitions, so a consumer that reports both never double-counts.
// In-process retries are counted as they happen. in_flight rises on the
// received transition and falls on the outcome.
package metrics
