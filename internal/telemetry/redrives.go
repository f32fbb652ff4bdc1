package telemetry

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// Sources of redriven messages (the SourceKey attribute of warren.redrives).
const (
	RedriveFromPoison = "poison" // a poison queue
	RedriveFromParked = "parked" // the delay levels' parking queue
)

// Redrives counts messages replayed into their queue from a poison queue or the parking
// queue (warren.redrives). Tools that replay messages create one with NewRedrives and call
// Add once the broker has confirmed the replayed messages.
type Redrives struct{ c metric.Int64Counter }

// NewRedrives creates the warren.redrives counter from mp; nil means
// otel.GetMeterProvider().
func NewRedrives(mp metric.MeterProvider) (*Redrives, error) {
	c, err := Meter(mp).Int64Counter(NameRedrives, metric.WithUnit("{message}"),
		metric.WithDescription("Messages replayed into their queue from a poison queue or the parking queue."))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", NameRedrives, err)
	}
	return &Redrives{c: c}, nil
}

// Add counts n messages replayed into queue from source (RedriveFromPoison or
// RedriveFromParked).
func (r *Redrives) Add(ctx context.Context, queue, source string, n int) {
	r.c.Add(ctx, int64(n), metric.WithAttributes(QueueKey.String(queue), SourceKey.String(source)))
}
