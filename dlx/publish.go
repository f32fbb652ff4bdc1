package dlx

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/due"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/topology"
)

// outgoing is a message of a Publish call as it is sent, and where it stands.
type outgoing struct {
	pub       amqp.Publishing
	due       time.Time // zero: at once
	lane      string    // the lane queue of a queue ordered by key, "" for others
	confirmed bool      // by the broker
	suspect   bool      // in flight when a broker refusal closed the channel
	flight    amqpx.Inflight
}

// Publish publishes msgs to topic's destination and returns once the broker has confirmed
// all of them. Transient failures (a lost connection) are retried until
// Config.PublishTimeout; a message may then reach the broker twice, never zero times
// without an error. Publish returns early, with that context's error, when the context of
// one of msgs ends. An error that publishing again cannot cure (see warren.PermanentError)
// is marked warren.Permanent.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.publish(topic, msgs)
	if err != nil && isPermanent(err) {
		return warren.Permanent(err)
	}
	return err
}

// publish encodes msgs, then sends them (and the ledger records of the scheduled ones) until
// the broker has confirmed every one or Config.PublishTimeout passes, and records the metrics
// of the call.
func (p *Publisher) publish(topic string, msgs []*message.Message) error {
	route := p.cfg.Route(topic)
	var one [1]outgoing // a Publish of one message, the usual one, encodes it on the stack
	out, records, err := p.encode(one[:0], topic, route, msgs, time.Now())
	if err != nil {
		return err
	}
	ctx, cancel := messagesContext(msgs)
	defer cancel()
	start := time.Now()
	err = amqpx.RetryLogged(ctx, p.cfg.PublishTimeout, "", p.logger, func() string { return "dlx: publish to " + topic }, func(ctx context.Context) error {
		return p.send(ctx, route, out, records)
	})
	p.recordPublish(ctx, route, start, out, err)
	if err != nil {
		return fmt.Errorf("dlx: publish to %q: %w", topic, err) // formatted only on failure
	}
	return nil
}

// encode appends msgs to out as they are published to route at now, and returns the ledger
// records of those scheduled with an id (see warren.Schedule) and delayed, to be published
// before them. It fails on the first message that cannot be sent as asked, before anything
// is sent.
func (p *Publisher) encode(out []outgoing, topic string, route Route, msgs []*message.Message, now time.Time) (_, records []outgoing, err error) {
	out = slices.Grow(out, len(msgs))
	for _, msg := range msgs {
		o, plan, err := p.encodeOne(topic, route, msg, now)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, o)
		if sid := msg.Metadata.Get(warren.MetadataScheduleID); sid != "" && plan.Exchange != "" {
			records = append(records, p.scheduledRecord(sid, route, o.due, now))
		}
	}
	return out, records, nil
}

// encodeOne returns msg as it is published to route at now, and the delay plan it is checked
// against: a delay that can never be planned is warren.ErrInvalidDelay, properties that do
// not fit a frame with the plan's headers are warren.ErrTooLarge.
func (p *Publisher) encodeOne(topic string, route Route, msg *message.Message, now time.Time) (outgoing, topology.Plan, error) {
	at, err := due.At(msg, now, p.cfg.PastTolerance)
	var plan topology.Plan
	if err == nil && !at.IsZero() {
		plan, err = p.delay.Plan(max(at.Sub(now), 0)) // reject what can never be planned
	}
	if err != nil {
		return outgoing{}, plan, fmt.Errorf("dlx: publish message %s to %q: %w: %w", msg.UUID, topic, warren.ErrInvalidDelay, err)
	}
	lane, err := p.lane(route, msg)
	if err != nil {
		return outgoing{}, plan, fmt.Errorf("dlx: publish message %s to %q: %w", msg.UUID, topic, err)
	}
	pub, err := p.marshal(msg)
	if err != nil {
		return outgoing{}, plan, err
	}
	if err := fits(pub, plan, route, lane); err != nil {
		return outgoing{}, plan, fmt.Errorf("dlx: publish message %s to %q: %w", msg.UUID, topic, err)
	}
	return outgoing{pub: pub, due: at, lane: lane}, plan, nil
}

// lane is the lane queue msg goes to when route is a queue ordered by key, listed in
// Config.Declare or Declare: by msg's order key, which it must have (warren.ErrNoOrderKey).
// A queue whose lanes the publisher does not know gets the message itself.
func (p *Publisher) lane(route Route, msg *message.Message) (string, error) {
	if route.Exchange != "" || !p.ordered.Load() {
		return "", nil
	}
	p.mu.Lock()
	q := p.queues[route.RoutingKey]
	p.mu.Unlock()
	if q.Lanes == 0 {
		return "", nil
	}
	key := warren.OrderKey(msg)
	if key == "" {
		return "", warren.ErrNoOrderKey
	}
	return topology.LaneQueue(q.Name, topology.Lane(key, q.Lanes)), nil
}

// marshal returns msg's publishing: its metadata as headers, without the instructions to the
// publisher (see sentMetadata), and its publish id, warren.MetadataPublishID or a new one.
func (p *Publisher) marshal(msg *message.Message) (amqp.Publishing, error) {
	pub, err := p.cfg.Marshaler.Marshal(msg)
	if err != nil {
		return pub, fmt.Errorf("dlx: marshal message %s: %w", msg.UUID, err)
	}
	for k := range pub.Headers {
		if !sentMetadata(k) {
			delete(pub.Headers, k)
		}
	}
	if pub.Headers == nil {
		pub.Headers = amqp.Table{}
	}
	id := msg.Metadata.Get(warren.MetadataPublishID)
	if id == "" {
		id = publishID()
	}
	pub.Headers[contract.PublishIDHeader] = id
	return pub, nil
}

// send is one attempt at publishing: it connects, declares route's destination, publishes
// the ledger records, then the messages not confirmed yet. The records go first, so that a
// scheduled message is never delivered unlisted. A message that was in flight when a broker
// refusal closed the channel is sent alone first (see publishAlone).
func (p *Publisher) send(ctx context.Context, route Route, out, records []outgoing) error {
	conf, err := p.connect(ctx)
	if err != nil {
		return err
	}
	if err := p.declare(ctx, route); err != nil {
		return err
	}
	if len(records) > 0 {
		if err := p.declareLedger(ctx); err != nil {
			return err
		}
		if err := p.publishAll(ctx, conf, p.ledgerRoute(), records); err != nil {
			return err
		}
	}
	for i := range out {
		if out[i].suspect && !out[i].confirmed {
			if err := p.publishAlone(ctx, route, out[i]); err != nil {
				return err
			}
			out[i].confirmed = true
		}
	}
	return p.publishAll(ctx, conf, route, out)
}

// recordPublish records the metrics of a Publish call to route that started at start: the
// messages the broker confirmed and the others, and the call's duration and error.
func (p *Publisher) recordPublish(ctx context.Context, route Route, start time.Time, out []outgoing, err error) {
	if len(out) == 0 {
		return
	}
	sent := 0
	for i := range out {
		if out[i].confirmed {
			sent++
		}
	}
	p.metrics.Published(ctx, p.publishAttrs(route), start, sent, len(out)-sent, err)
}

// messagesContext returns a context that ends when the context of any of msgs ends.
func messagesContext(msgs []*message.Message) (context.Context, context.CancelFunc) {
	if !slices.ContainsFunc(msgs, func(m *message.Message) bool { return m.Context().Done() != nil }) {
		return context.Background(), func() {} // none can end (the usual case): nothing to watch
	}
	if len(msgs) == 1 { // a handler's output or reply: its own context, with nothing to watch
		return msgs[0].Context(), func() {}
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	var stops []func() bool
	watched := map[<-chan struct{}]bool{} // messages of one caller share a context: watched once
	for _, msg := range msgs {
		mctx := msg.Context()
		if mctx.Err() != nil {
			cancel(context.Cause(mctx))
		} else if done := mctx.Done(); done != nil && !watched[done] {
			watched[done] = true
			stops = append(stops, context.AfterFunc(mctx, func() { cancel(context.Cause(mctx)) }))
		}
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel(nil)
	}
}

// publishID returns a new id for contract.PublishIDHeader: 64 random bits, in hex.
func publishID() string {
	return strconv.FormatUint(rand.Uint64(), 16)
}

// destination is what the metrics of a publish are recorded by: the exchange, and the queue
// for a publish to the default exchange.
type destination struct{ exchange, queue string }

// publishAttrs returns the attribute sets of the metrics of a publish to route.
func (p *Publisher) publishAttrs(route Route) *telemetry.Publish {
	d := destination{exchange: route.Exchange}
	if d.exchange == "" {
		d.queue = route.RoutingKey
	}
	p.attrsMu.RLock()
	a := p.attrs[d]
	p.attrsMu.RUnlock()
	if a != nil {
		return a
	}
	a = telemetry.NewPublish(d.exchange, d.queue)
	p.attrsMu.Lock()
	p.attrs[d] = a
	p.attrsMu.Unlock()
	return a
}
