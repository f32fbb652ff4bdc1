package router

import (
	"context"
	"errors"
	"hash/fnv"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/statequeue"
	"github.com/warrenmq/warren/topology"
)

// balanceEvery is how often a handler of a queue ordered by key counts the processes that
// run it and takes or gives up lanes to hold its share.
const balanceEvery = time.Second

// laneBackoff is the wait before the balancer connects again after losing its connection.
var laneBackoff = amqpx.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}

// lanes subscribes a handler of a queue ordered by key to the queue itself and to its share
// of the queue's lanes, on one subscriber, and hands their messages to the handler through one
// channel.
//
// The processes that run the handler share the lanes through the broker alone. Each one
// consumes from a members queue (MembersQueue), whose consumer count says how many there are
// (P), and holds a lease on each lane it consumes: the lock of LeaseQueue (statequeue.Lock, an
// exclusive consumer on a channel of its own connection, which the broker refuses to anyone
// else and drops when the connection goes). Every balanceEvery it takes free lanes while it
// holds fewer than ceil(N/P), and gives lanes up while it holds more: it stops consuming the
// lane (its channel's close returns to the lane, in order, what it had not settled) and only
// then releases the lease. A process that dies loses its leases with its connection, and the
// others take its lanes at their next turn.
// The lanes' single active consumer keeps a lane to one consumer even when two processes
// believe they lease it.
type lanes struct {
	*consumer.Subscriber
	n      int
	dialer *amqpx.Dialer
	logger watermill.LoggerAdapter
}

// MembersQueue is the queue whose consumers are the processes that handle ordered queue
// queue (see HandlerConfig.Lanes; amqpx.DeclareCounter): deleted when the last one goes.
func MembersQueue(queue string) string { return queue + ".lanes" }

// LeaseQueue is the lock queue (see statequeue.Lock) a process that consumes lane lane of
// ordered queue queue holds while it does (see HandlerConfig.Lanes).
func LeaseQueue(queue string, lane int) string { return topology.LaneQueue(queue, lane) + ".lease" }

// Subscribe subscribes to queue and, as they are leased, to its lanes, all handing their
// messages out on one channel (consumer.Subscriber.SubscribeInto), closed once ctx has ended
// and every subscription has ended.
func (l lanes) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	done, err := l.SubscribeInto(ctx, queue, out)
	if err != nil {
		return nil, err
	}
	b := &balancer{lanes: l, queue: queue, out: out, held: map[int]*leased{}, start: offset(queue, l.n)}
	b.subs.Go(func() { <-done })
	b.subs.Go(func() { b.run(ctx) })
	go func() {
		b.subs.Wait()
		close(out)
	}()
	return out, nil
}

// leased is a lane the process consumes: cancel stops its subscription, done is closed once
// it has ended.
type leased struct {
	cancel context.CancelFunc
	done   <-chan struct{}
	unlock func() // gives the lease up
}

// balancer keeps the process's share of the lanes (see lanes).
type balancer struct {
	lanes
	queue string
	out   chan *message.Message // the subscriptions' messages, the queue's and its lanes'
	subs  sync.WaitGroup        // the subscriptions, and run
	held  map[int]*leased
	start int // the lane it tries first: processes start apart
}

// offset is where this process starts looking for free lanes of queue among n.
func offset(queue string, n int) int {
	h := fnv.New32a()
	host, _ := os.Hostname()
	_, _ = h.Write([]byte(host + "/" + strconv.Itoa(os.Getpid()) + "/" + queue))
	return int(h.Sum32() % uint32(n))
}

// run balances on a connection of its own, connecting again when it is lost, until ctx ends;
// it then gives up every lane.
func (b *balancer) run(ctx context.Context) {
	defer b.releaseAll()
	fields := watermill.LogFields{"queue": b.queue}
	_ = amqpx.Reconnect(ctx, laneBackoff, func(ctx context.Context, steady func()) error {
		conn, err := b.dialer.Dial(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = amqpx.Close(conn) }()
		stop := amqpx.Watch(ctx, conn)
		defer stop()
		err = b.session(ctx, conn, steady)
		b.releaseAll() // the leases went with the connection: so do the lanes
		return err
	}, amqpx.LogEach(b.logger, "Lanes lost their connection, reconnecting", fields))
}

// session joins the members on conn and balances every balanceEvery until ctx ends or conn is
// lost.
func (b *balancer) session(ctx context.Context, conn *amqp.Connection, steady func()) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	members := MembersQueue(b.queue)
	if err := amqpx.DeclareCounter(ch, members); err != nil {
		return err
	}
	if _, err := ch.Consume(members, "", true, false, false, false, nil); err != nil {
		return err
	}
	steady()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	t := time.NewTicker(balanceEvery)
	defer t.Stop()
	for {
		if err := b.balance(ctx, conn, ch); err != nil {
			return err
		}
		select {
		case <-t.C:
		case err := <-closed:
			if err == nil {
				return errors.New("connection closed")
			}
			return err
		case <-ctx.Done():
			return nil
		}
	}
}

// balance takes free lanes, or gives up lanes, so that the process holds its share.
func (b *balancer) balance(ctx context.Context, conn *amqp.Connection, ch *amqp.Channel) error {
	q, err := ch.QueueDeclarePassive(MembersQueue(b.queue), false, true, false, false, nil)
	if err != nil {
		return err
	}
	processes := max(q.Consumers, 1)
	share := (b.n + processes - 1) / processes
	var excess []int
	for lane := range b.held {
		if len(b.held)-len(excess) <= share {
			break
		}
		excess = append(excess, lane)
	}
	b.release(excess...)
	for k := 0; k < b.n && len(b.held) < share && ctx.Err() == nil; k++ {
		lane := (b.start + k) % b.n
		if b.held[lane] != nil {
			continue
		}
		// One try: the lease of a lane another process holds is refused at once; a broker slow
		// to answer is waited for, lest a free lane wait a turn.
		tryCtx, cancel := context.WithTimeout(ctx, leaseTry)
		unlock, err := statequeue.TryLock(tryCtx, conn, LeaseQueue(b.queue, lane))
		cancel()
		switch {
		case err != nil && conn.IsClosed():
			return err
		case err != nil:
			continue
		}
		if err := b.take(ctx, lane, unlock); err != nil {
			unlock()
			return err
		}
	}
	return nil
}

// leaseTry bounds a balancer's try for a lane's lease (statequeue.TryLock): a broker that
// answers later than this (busy delivering the other lanes, say) leaves the lane to the next
// turn.
const leaseTry = time.Second

// take subscribes to lane, leased until unlock.
func (b *balancer) take(ctx context.Context, lane int, unlock func()) error {
	lctx, cancel := context.WithCancel(ctx)
	done, err := b.SubscribeInto(lctx, topology.LaneQueue(b.queue, lane), b.out)
	if err != nil {
		cancel()
		return err
	}
	b.subs.Go(func() { <-done }) // from run, which counts: never after Wait has returned
	b.held[lane] = &leased{cancel: cancel, done: done, unlock: unlock}
	b.logger.Debug("Lane taken", watermill.LogFields{"queue": b.queue, "lane": lane})
	return nil
}

// release stops consuming lanes and gives each one's lease up once its subscription has
// ended (its channel closed), the lanes at once: a lane waits for its own handlers only, not
// for the other lanes'.
func (b *balancer) release(lanes ...int) {
	var wg sync.WaitGroup
	for _, lane := range lanes {
		l := b.held[lane]
		delete(b.held, lane)
		l.cancel()
		wg.Go(func() {
			<-l.done
			l.unlock()
			b.logger.Debug("Lane given up", watermill.LogFields{"queue": b.queue, "lane": lane})
		})
	}
	wg.Wait()
}

// releaseAll gives up every lane.
func (b *balancer) releaseAll() {
	b.release(slices.Collect(maps.Keys(b.held))...)
}
