package kill

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/statequeue"
	"github.com/warrenmq/warren/topology"
)

// StateQueue is the name of the durable queue that remembers the last kill command sent to
// the consumers of work queue queue, for those that start later: queue+".kill.state"
// without a secret. With a secret, the name carries an HMAC of the queue: RabbitMQ checks a
// publish against the exchange only, so any user who may publish to the default exchange
// (every warren application) can publish into a queue it can name, and read permission,
// which consumers need, is enough to purge it. Nobody without the secret can name this one.
func StateQueue(queue string, secret []byte) string {
	name := topology.KillExchange(queue) + ".state"
	if len(secret) > 0 {
		m := hmac.New(sha256.New, secret)
		fmt.Fprintf(m, "warren-kill-state\n%s", queue)
		name += "." + hex.EncodeToString(m.Sum(nil))[:16]
	}
	return name
}

// ListenerQueue is the name of the queue that counts the consumers listening to the kill
// topic of work queue queue (queue+".kill.listeners"): every subscription of a
// consumer.Subscriber, stopped or not, holds a consumer on it while it listens, and a Killer
// reads its consumer count (see Result.Listeners). It is auto-deleted once no subscription
// listens, and refuses every message published to it.
func ListenerQueue(queue string) string { return topology.KillExchange(queue) + ".listeners" }

// LockQueue is the name of the queue whose exclusive consumer holds the kill state of work
// queue queue while it reads or writes it (queue+".kill.lock"): Killers and consumers take
// turns. It is auto-deleted; readers of the state need configure and read permissions on it.
func LockQueue(queue string) string { return topology.KillExchange(queue) + ".lock" }

// stateArgs declare the kill state queue: see statequeue.Args.
var stateArgs = statequeue.Args

// ReadState returns the kill command remembered for the consumers of queue: the newest
// valid command of its kill state queue (StateQueue, named with secret), and whether there
// is one (none when the queue was never killed, or its state queue is gone). It reads under
// the state's lock, as consumers and Killers do, once no command of the state is out (see
// statequeue.Read; waited for as long as ctx lasts), and puts every command back as it found
// it. A Resume command means the queue is not killed.
func ReadState(ctx context.Context, conn *amqp.Connection, queue string, secret []byte) (Command, bool, error) {
	name := StateQueue(queue, secret)
	unlock, err := statequeue.Lock(ctx, conn, LockQueue(queue))
	if err != nil {
		return Command{}, false, fmt.Errorf("kill: state of %s: %w", queue, err)
	}
	defer unlock()
	var newest Command
	found := false
	err = statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
		ds, err := statequeue.Read(ctx, ch, name, statequeue.ReadMax)
		if len(ds) > 0 {
			last := ds[len(ds)-1].DeliveryTag
			defer func() { _ = ch.Nack(last, true, true) }()
		}
		if err != nil {
			return err
		}
		for _, d := range ds {
			var c Command
			if json.Unmarshal(d.Body, &c) != nil ||
				c.Verify(queue, secret, time.Now(), 0, time.Duration(math.MaxInt64)) != nil {
				continue // consumers refuse it too
			}
			if !found || c.At.After(newest.At) {
				newest, found = c, true
			}
		}
		return nil
	})
	if amqpx.IsNotFound(err) {
		return Command{}, false, nil
	}
	if err != nil {
		return Command{}, false, fmt.Errorf("kill: state of %s: %w", queue, err)
	}
	return newest, found, nil
}
