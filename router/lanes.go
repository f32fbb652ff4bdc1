package router

import (
	"context"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/topology"
)

// lanes subscribes a handler of a queue ordered by key to the queue's lanes and to the queue
// itself, on one subscriber, and hands their messages to the handler through one channel.
type lanes struct {
	message.Subscriber
	n int
}

// Subscribe subscribes to queue and its n lanes, and merges their messages until every one
// of the subscriptions has ended. A message that the handler can no longer take, because ctx
// ended, is settled as failed: its delivery goes back to its queue.
func (l lanes) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	ins := make([]<-chan *message.Message, 0, l.n+1)
	for _, name := range append([]string{queue}, laneQueues(queue, l.n)...) {
		in, err := l.Subscriber.Subscribe(ctx, name)
		if err != nil {
			return nil, err
		}
		ins = append(ins, in)
	}
	out := make(chan *message.Message)
	var wg sync.WaitGroup
	for _, in := range ins {
		wg.Go(func() {
			for msg := range in {
				select {
				case out <- msg:
				case <-ctx.Done():
					msg.Nack()
					contract.Settle(msg.Context(), false)
				}
			}
		})
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	return out, nil
}

func laneQueues(queue string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = topology.LaneQueue(queue, i)
	}
	return names
}
