//go:build faults

package dlx_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// On a 3-node cluster, the node that a publisher is connected to, and that leads the queue
// it publishes to, is killed and stays down. The publisher opens its connection again on
// another node at its next publish, before the survivors have elected the queue's new
// leader. RabbitMQ 3.10.8 then nacks every publish to the queue on that connection's first
// channel until the dead node is back, while a channel opened after the election takes them
// (4.0.5 nacks none): the publisher moves to a fresh channel after a nack, so no Publish
// fails and every confirmed message is in the queue.
func TestPublishAfterANackGoesOnAFreshChannel(t *testing.T) {
	t.Parallel()
	c := testenv.StartCluster(t, 3)
	n1 := c.Nodes[0]
	const queue = "nacked.leader.dest"
	b, err := topology.NewBuilder(topology.Config{Delay: topology.Delay{Disabled: true}}, nil)
	require.NoError(t, err)
	// Declared through n1, which therefore leads it (queue_leader_locator client-local).
	require.NoError(t, b.Apply(t.Context(), warren.Connection{URL: n1.URL()}, topology.Topology{Queues: []topology.Queue{{Name: queue}}}))

	// A publisher given every node, made again until it is connected to n1.
	var pub *dlx.Publisher
	for try := 1; pub == nil; try++ {
		var mu sync.Mutex
		var at string
		p, err := dlx.NewPublisher(dlx.Config{
			Connection: warren.Connection{URL: c.URL(), OnEvent: func(e warren.ConnectionEvent) {
				mu.Lock()
				defer mu.Unlock()
				if at == "" {
					at = e.Node
				}
			}},
			Topology:       topology.Config{Delay: topology.Delay{Disabled: true}},
			Route:          func(topic string) dlx.Route { return dlx.Route{RoutingKey: topic, Declared: true} },
			PublishTimeout: 5 * time.Second,
		}, watermill.NopLogger{})
		require.NoError(t, err)
		mu.Lock()
		on := at
		mu.Unlock()
		if on == n1.Addr() || try == 20 {
			require.Equal(t, n1.Addr(), on, "the publisher's node")
			pub = p
		} else {
			require.NoError(t, p.Close())
		}
	}
	defer pub.Close()

	// One publisher goroutine, a message every 10 ms, until 8 s after the kill.
	var (
		mu        sync.Mutex
		confirmed = map[string]bool{}
		failed    []string
		slowest   time.Duration
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			id := strconv.Itoa(i)
			start := time.Now()
			err := pub.Publish(queue, message.NewMessage(id, []byte(id)))
			mu.Lock()
			slowest = max(slowest, time.Since(start))
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", id, err))
			} else {
				confirmed[id] = true
			}
			mu.Unlock()
		}
	}()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(confirmed) >= 50
	}, testenv.Patience(), 10*time.Millisecond)
	n1.Kill()
	time.Sleep(8 * time.Second) // longer than PublishTimeout: a wedged channel fails Publish
	close(stop)
	<-done

	// Every confirmed message is in the queue, read from a surviving node.
	conn, err := amqp.Dial(c.Nodes[1].URL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	inQueue := map[string]int{}
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			break
		}
		inQueue[string(d.Body)]++
	}
	mu.Lock()
	defer mu.Unlock()
	lost := 0
	for id := range confirmed {
		if inQueue[id] == 0 {
			lost++
		}
	}
	t.Logf("confirmed %d, failed %d, in the queue %d, lost %d, slowest Publish %s",
		len(confirmed), len(failed), len(inQueue), lost, slowest.Round(time.Millisecond))
	assert.Empty(t, failed, "no Publish fails while a majority of the nodes is up")
	assert.Zero(t, lost, "every confirmed message is in the queue")
}
