package relay

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Failure reasons, the reason label of outbox_publish_failed_total.
const (
	reasonNack        = "nack"
	reasonUnroutable  = "unroutable"
	reasonUnconfirmed = "unconfirmed" // the channel or connection closed before the confirm
	reasonInvalid     = "invalid"     // a row that cannot be published: corrupt headers, too large
)

type metrics struct {
	pending   prometheus.Gauge
	oldestAge prometheus.Gauge
	published prometheus.Counter
	failed    *prometheus.CounterVec
	lag       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "inboxmq", Name: "outbox_pending_rows",
			Help: "Outbox rows not yet published (refreshed every StatsInterval).",
		}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "inboxmq", Name: "outbox_oldest_pending_age_seconds",
			Help: "Age of the oldest unpublished outbox row (0 when none).",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "inboxmq", Name: "outbox_published_total",
			Help: "Outbox messages confirmed by the broker and marked sent.",
		}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "inboxmq", Name: "outbox_publish_failed_total",
			Help: "Outbox publishes that were not confirmed, by reason (nack, unroutable, unconfirmed).",
		}, []string{"reason"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "inboxmq", Name: "outbox_relay_lag_seconds",
			Help:    "Time from enqueue (row creation) to the broker's confirm.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14), // 1ms … ~150s
		}),
	}
	var err error
	m.pending = register(reg, m.pending, &err)
	m.oldestAge = register(reg, m.oldestAge, &err)
	m.published = register(reg, m.published, &err)
	m.failed = register(reg, m.failed, &err)
	m.lag = register(reg, m.lag, &err)
	if err != nil {
		return nil, err
	}
	for _, r := range []string{reasonNack, reasonUnroutable, reasonUnconfirmed} {
		m.failed.WithLabelValues(r)
	}
	return m, nil
}

// register registers c, or returns the collector already registered under
// its name (so relays can share a registerer).
func register[C prometheus.Collector](reg prometheus.Registerer, c C, errp *error) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		*errp = errors.Join(*errp, err)
	}
	return c
}
