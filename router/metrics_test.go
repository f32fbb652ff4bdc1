package router_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// metricPoints collects reader's metrics as "name{attributes}": the value of a sum or gauge,
// the count of a histogram.
func metricPoints(t *testing.T, reader *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	points := map[string]float64{}
	key := func(name string, attrs attribute.Set) string {
		return name + "{" + attrs.Encoded(attribute.DefaultEncoder()) + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					points[key(m.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range data.DataPoints {
					points[key(m.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					points[key(m.Name, p.Attributes)] = float64(p.Count)
				}
			default:
				t.Errorf("metric %s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return points
}

// After a known workload the metrics count exactly what happened: 16 messages published one
// per call and one delayed, 4 of them failing once (retried), 2 failing every attempt
// (retried twice, then poisoned), then a kill and a resume.
func TestMetricsCountTheWorkload(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("metrics")
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	delay := env.Delay(topology.Delay{})
	r := newRouter(t, env, func(c *router.Config) {
		c.MeterProvider = mp
		c.Topology.Delay = delay
		// 3 attempts. Delays long enough that each retry still has a wait left when it is
		// published (one whose delay passed before its publish goes straight to the queue,
		// and records no lateness): on a loaded machine a 50 ms delay did not.
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{time.Second, time.Second}}
	})
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
		switch fail := msg.Metadata.Get("fail"); {
		case fail == "always", fail == "once" && middleware.Attempt(msg) == 1:
			return errors.New("declined")
		}
		return nil
	}))
	start(t, r)

	const ok, once, always = 10, 4, 2
	for i := range ok + once + always {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(i)))
		switch {
		case i >= ok+once:
			msg.Metadata.Set("fail", "always")
		case i >= ok:
			msg.Metadata.Set("fail", "once")
		}
		require.NoError(t, r.Publisher().Publish(queue, msg))
	}
	delayed := message.NewMessage(watermill.NewUUID(), []byte("later"))
	warren.Delay(delayed, 100*time.Millisecond)
	require.NoError(t, r.Publisher().Publish(queue, delayed))

	const (
		published = ok + once + always + 1 // one call each
		retried   = once + 2*always        // attempts 2 (once and always) and 3 (always)
		handled   = published + retried    // handler calls
		failed    = once + 3*always        // failed handler calls
	)
	system, group, dest := "messaging.system=rabbitmq", "messaging.consumer.group.name="+queue, "messaging.destination.name="
	send := func(q string) string {
		return dest + ",messaging.operation.name=send,messaging.rabbitmq.destination.routing_key=" + q + "," + system
	}
	sendOp := func(q string) string {
		return dest + ",messaging.operation.name=send,messaging.operation.type=send,messaging.rabbitmq.destination.routing_key=" + q + "," + system
	}
	process := group + "," + dest + ",messaging.operation.name=process,messaging.operation.type=process," + system
	poison := topology.PoisonQueue(queue)
	parked := "warren.delay.parked{warren.queue=" + delay.ParkingQueue() + "}"
	want := map[string]float64{
		// Publisher and retries (to the queue, through the default exchange); poison copies.
		"messaging.client.sent.messages{" + send(queue) + "}":                                                            published + retried,
		"messaging.client.sent.messages{" + send(poison) + "}":                                                           always,
		"messaging.client.operation.duration{" + sendOp(queue) + "}":                                                     published + retried,
		"messaging.client.operation.duration{" + sendOp(poison) + "}":                                                    always,
		"messaging.client.consumed.messages{" + process + "}":                                                            handled,
		"messaging.process.duration{" + process + "}":                                                                    handled - failed,
		"messaging.process.duration{error.type=*errors.errorString," + process + "}":                                     failed,
		"warren.retries.scheduled{warren.attempt=2,warren.queue=" + queue + "}":                                          once + always,
		"warren.retries.scheduled{warren.attempt=3,warren.queue=" + queue + "}":                                          always,
		"warren.messages.poisoned{warren.poison.reason=" + warren.PoisonReasonExhausted + ",warren.queue=" + queue + "}": always,
		"warren.delay.lateness{warren.queue=" + queue + "}":                                                              retried + 1, // every retry is delayed
		parked: 0,
	}
	var differ []string
	settled := assert.Eventually(t, func() bool {
		got := metricPoints(t, reader)
		differ = differ[:0]
		for k, v := range want {
			if got[k] != v {
				differ = append(differ, fmt.Sprintf("%s: %v, want %v", k, got[k], v))
			}
		}
		return len(differ) == 0
	}, testenv.Patience(), 50*time.Millisecond, "the workload's metrics")
	if !settled {
		env.LogDepths()
		t.Fatalf("metrics that differ:\n%s", strings.Join(differ, "\n"))
	}

	k, err := kill.NewKiller(kill.Config{Connection: env.Connection()}, env.Logger())
	require.NoError(t, err)
	killEvents := func(action, state string) string {
		return "warren.kill.events{warren.kill.action=" + action + ",warren.kill.state=" + state + ",warren.queue=" + queue + "}"
	}
	require.NoError(t, k.Kill(context.Background(), queue, kill.Stop))
	require.Eventually(t, func() bool { return metricPoints(t, reader)[killEvents("stop", "stopped")] == 1 },
		testenv.Patience(), 20*time.Millisecond)
	require.NoError(t, k.Resume(context.Background(), queue))
	require.Eventually(t, func() bool { return metricPoints(t, reader)[killEvents("resume", "resumed")] == 1 },
		testenv.Patience(), 20*time.Millisecond)
	want[killEvents("stop", "stopped")], want[killEvents("resume", "resumed")] = 1, 1

	got := metricPoints(t, reader)
	if !assert.Equal(t, want, got) {
		keys := make([]string, 0, len(got))
		for k := range got {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			t.Logf("%s %g", k, got[k])
		}
	}
}
