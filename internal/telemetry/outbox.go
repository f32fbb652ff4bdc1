package telemetry

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Names of the outbox relay's instruments.
const (
	NameOutboxRelayed  = "warren.outbox.relayed"
	NameOutboxSetAside = "warren.outbox.set_aside"
	NameOutboxLag      = "warren.outbox.lag"
)

// SchemaKey is the outbox's PostgreSQL schema.
const SchemaKey = attribute.Key("warren.outbox.schema")

// Outbox are the instruments of an outbox relay: messages relayed (confirmed by the broker
// and deleted), rows set aside, and the time from a row's write to its confirm.
type Outbox struct {
	relayed  metric.Int64Counter
	setAside metric.Int64Counter
	lag      metric.Float64Histogram
	attrs    metric.MeasurementOption
}

// NewOutbox creates the relay's instruments for schema from mp; nil means
// otel.GetMeterProvider().
func NewOutbox(mp metric.MeterProvider, schema string) (*Outbox, error) {
	m := Meter(mp)
	o := &Outbox{attrs: metric.WithAttributeSet(attribute.NewSet(SchemaKey.String(schema)))}
	var err error
	if o.relayed, err = m.Int64Counter(NameOutboxRelayed, metric.WithUnit("{message}"),
		metric.WithDescription("Messages of the outbox that the broker confirmed and the relay deleted.")); err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", NameOutboxRelayed, err)
	}
	if o.setAside, err = m.Int64Counter(NameOutboxSetAside, metric.WithUnit("{message}"),
		metric.WithDescription("Rows of the outbox set aside because the broker will never take their message.")); err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", NameOutboxSetAside, err)
	}
	if o.lag, err = m.Float64Histogram(NameOutboxLag, metric.WithUnit("s"),
		metric.WithDescription("Time from a message's write into the outbox to the broker's confirm of its publish."),
		metric.WithExplicitBucketBoundaries(latenessBuckets...)); err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", NameOutboxLag, err)
	}
	return o, nil
}

// Relayed records messages written at the times written, confirmed at now.
func (o *Outbox) Relayed(ctx context.Context, written []time.Time, now time.Time) {
	o.relayed.Add(ctx, int64(len(written)), o.attrs)
	for _, w := range written {
		o.lag.Record(ctx, max(now.Sub(w), 0).Seconds(), o.attrs)
	}
}

// SetAside records a row set aside.
func (o *Outbox) SetAside(ctx context.Context) { o.setAside.Add(ctx, 1, o.attrs) }
