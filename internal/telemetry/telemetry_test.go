package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/warrenmq/warren/internal/telemetry"
)

// The hot path (a message consumed, processed without error, published) allocates nothing
// with the SDK's MeterProvider.
func TestHotPathDoesNotAllocate(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	i, err := telemetry.New(mp)
	require.NoError(t, err)
	var consumes telemetry.Consumes
	pub := telemetry.NewPublish("", "billing")
	ctx := context.Background()
	start := time.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		c := consumes.Get("billing", "events")
		i.Consumed(ctx, c)
		i.Processed(ctx, c, start, nil)
		i.Published(ctx, pub, start, 1, 0, nil)
	})
	assert.Zero(t, allocs)
}

// A failure is recorded with error.type, the Go type of the innermost error; a publish call
// counts its messages sent and failed apart.
func TestFailuresCarryErrorType(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	i, err := telemetry.New(mp)
	require.NoError(t, err)
	ctx := context.Background()
	pub := telemetry.NewPublish("events", "order.created")
	i.Published(ctx, pub, time.Now(), 2, 1, fmt.Errorf("publish: %w", context.DeadlineExceeded))
	i.Processed(ctx, telemetry.NewConsume("billing", ""), time.Now(), fmt.Errorf("charge: %w", errors.New("declined")))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := map[string]int64{} // instrument and error.type: count
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					e, _ := dp.Attributes.Value("error.type")
					_, hasKey := dp.Attributes.Value("messaging.rabbitmq.destination.routing_key")
					assert.False(t, hasKey, "a topic exchange's routing key is left out")
					got[m.Name+" "+e.AsString()] += dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					e, _ := dp.Attributes.Value("error.type")
					got[m.Name+" "+e.AsString()] += int64(dp.Count)
				}
			}
		}
	}
	assert.Equal(t, map[string]int64{
		"messaging.client.sent.messages ":                                   2,
		"messaging.client.sent.messages context.deadlineExceededError":      1,
		"messaging.client.operation.duration context.deadlineExceededError": 1,
		"messaging.process.duration *errors.errorString":                    1,
	}, got)
}

// NewRedrives makes the counter that tools replaying messages increment.
func TestRedrivesCounts(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	r, err := telemetry.NewRedrives(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	require.NoError(t, err)
	r.Add(context.Background(), "billing", telemetry.RedriveFromPoison, 3)
	r.Add(context.Background(), "billing", telemetry.RedriveFromParked, 1)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	require.Len(t, rm.ScopeMetrics, 1)
	assert.Equal(t, telemetry.ScopeName, rm.ScopeMetrics[0].Scope.Name)
	m := rm.ScopeMetrics[0].Metrics[0]
	assert.Equal(t, telemetry.NameRedrives, m.Name)
	assert.Equal(t, "{message}", m.Unit)
	got := map[string]int64{}
	for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
		q, _ := p.Attributes.Value(telemetry.QueueKey)
		src, _ := p.Attributes.Value(telemetry.SourceKey)
		got[q.AsString()+" "+src.AsString()] = p.Value
	}
	assert.Equal(t, map[string]int64{"billing poison": 3, "billing parked": 1}, got)
}

// BenchmarkHotPath is what metrics cost a message on the hot path with the SDK: consumed,
// processed, and one publish (its output, or a retry).
func BenchmarkHotPath(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	i, err := telemetry.New(mp)
	require.NoError(b, err)
	var consumes telemetry.Consumes
	pub := telemetry.NewPublish("", "billing")
	ctx := context.Background()
	start := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		c := consumes.Get("billing", "events")
		i.Consumed(ctx, c)
		i.Processed(ctx, c, start, nil)
		i.Published(ctx, pub, start, 1, 0, nil)
	}
}
