package middleware

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
)

// ClaimState is what IdempotencyStore.Claim found.
type ClaimState int

const (
	// Claimed means the caller holds the key now, and processes the message.
	Claimed ClaimState = iota
	// Processed means the key was processed within its retention; the message is skipped.
	Processed
	// Busy means a holder that is alive holds the key (a copy is being processed, in this process
	// or another); the message is to be tried again later.
	Busy
)

// IdempotencyStore remembers, for Idempotent, which keys are being processed and which were
// processed. A claim whose holder is gone (a process killed while it processed the message)
// must not block the key for ever: a store frees it after a lease (see redisstore).
//
// NewMemoryStore is a store for one process; redisstore.New one that the processes of a
// service share.
type IdempotencyStore interface {
	// Claim takes key, unless it is held or was processed.
	Claim(ctx context.Context, key string) (ClaimState, error)
	// Done records that key was processed, for retention; the claim ends.
	Done(ctx context.Context, key string, retention time.Duration) error
	// Release gives a claimed key up without recording it: the next Claim takes it.
	Release(ctx context.Context, key string) error
}

// IdempotentConfig configures Idempotent.
type IdempotentConfig struct {
	// Store holds the claims and the processed keys. Required.
	Store IdempotencyStore
	// Key returns the key of msg; a message whose key is "" is handled without the store.
	// CopyKey (copies of one publish), MessageIDKey (a message id sent twice) or a key of the
	// user's own; which one depends on where Idempotent sits (see Idempotent). Default
	// CopyKey.
	Key func(msg *message.Message) string
	// Retention is how long a processed key is remembered. Default 10m.
	Retention time.Duration
	// Timeout bounds each call to the Store. Default 5s.
	Timeout time.Duration
	// BusyWait is how long a message whose key another holder holds waits for it, asking the
	// Store again from time to time (every 20ms at first, then less often, up to every
	// 500ms), before it goes back to its queue: it is acked as soon as the holder records the
	// key processed, and handled as soon as the holder gives it up or its claim ends (a
	// redisstore lease). Waiting here rather than in the queue matters on a quorum queue,
	// which counts every requeue against its delivery limit (20 by default in warren) and
	// dead-letters the message into the poison queue past it: requeued every
	// RequeueDelay (1s) while a dead holder's claim runs out its lease (15s), or while a slow
	// twin works, a message would come near the limit. Default 30s, twice redisstore's
	// default lease; a shutdown ends the wait at once (the message goes back to the queue).
	BusyWait time.Duration
}

// WithDefaults returns c with every unset field set to its default.
func (c IdempotentConfig) WithDefaults() IdempotentConfig {
	if c.Key == nil {
		c.Key = CopyKey
	}
	if c.Retention == 0 {
		c.Retention = DefaultIdempotentRetention
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultIdempotentTimeout
	}
	if c.BusyWait == 0 {
		c.BusyWait = DefaultIdempotentBusyWait
	}
	return c
}

// Defaults of IdempotentConfig.
const (
	DefaultIdempotentRetention = 10 * time.Minute
	DefaultIdempotentTimeout   = 5 * time.Second
	DefaultIdempotentBusyWait  = 30 * time.Second
)

// Validate reports the first field of c that is not usable.
func (c IdempotentConfig) Validate() error {
	switch {
	case c.Store == nil:
		return errors.New("middleware: IdempotentConfig.Store is nil")
	case c.Retention < 0:
		return fmt.Errorf("middleware: IdempotentConfig.Retention %s is negative", c.Retention)
	case c.Timeout < 0:
		return fmt.Errorf("middleware: IdempotentConfig.Timeout %s is negative", c.Timeout)
	case c.BusyWait < 0:
		return fmt.Errorf("middleware: IdempotentConfig.BusyWait %s is negative", c.BusyWait)
	}
	return nil
}

// Idempotent handles a message at most once per key (within Retention): it claims the
// message's key in the Store before calling the handler, records it as processed when the
// handler returns no error, and gives the claim up when it returns one or panics (so that a
// retry, or a copy, may take it). A message whose key was processed is acked without calling
// the handler; one whose key another holder is processing waits for that holder, up to
// BusyWait, and then goes back to its queue as a *RequeueError, to be tried again later. A
// holder that dies while it processes (a process killed) holds the key until the store
// frees it: MemoryStore's claims die with the process; redisstore's end with their lease.
//
// What "processed" means depends on where Idempotent sits, and the key goes with the place:
//
//   - Around the handler, inside Backoff (router.HandlerConfig.Middleware, the last of
//     warren's default chain), it is success: a business operation happens once per key. A
//     failed attempt releases the key, so that Backoff's retry (which keeps the message id)
//     or a copy may take it; a copy that finds the key held still after BusyWait goes back
//     to its queue, past Backoff and Poison, as neither a failure nor a retry. Key it by
//     MessageIDKey, or by a key of the user's own (an order id). One caution: the outputs
//     of router.HandlerConfig.PublishTopic are published outside it, after the key is
//     recorded, so an output that cannot be published is not published by the retry either
//     (the retry finds the key processed).
//   - Outside Poison and Backoff, as router.Config.CopyStore places it (outermost), it is
//     "settled for good": processed, retried or poisoned. Key it by CopyKey there: every
//     copy of one delivery of one attempt (a publisher's re-send after a lost confirm, a
//     redelivery after a lost ack) is then handled once, in whichever process it arrives.
//     Never by MessageIDKey: a retry keeps the message id, and would be acked as processed
//     unhandled.
//
// The store is never a reason to lose a message or hold up a queue: when it fails, the
// message is handled as if there were no store, and the failure is logged.
type Idempotent struct {
	cfg    IdempotentConfig
	logger watermill.LoggerAdapter
}

// NewIdempotent returns an Idempotent, or an error naming the first invalid field of config.
func NewIdempotent(config IdempotentConfig, logger watermill.LoggerAdapter) (*Idempotent, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Idempotent{cfg: config.WithDefaults(), logger: logger}, nil
}

// Middleware is the message.HandlerMiddleware.
func (i *Idempotent) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		key := i.cfg.Key(msg)
		if key == "" {
			return h(msg)
		}
		state, err := i.claim(msg, key)
		switch {
		case err != nil:
			i.logger.Error("Idempotency store failed: the message is handled without it", err, logFields(msg, key))
			return h(msg)
		case state == Processed:
			i.logger.Info("Message processed already: acked", logFields(msg, key))
			return nil, nil
		case state == Busy:
			return nil, &RequeueError{Err: fmt.Errorf("key %q is being processed by another holder (waited up to %s)", key, i.cfg.BusyWait)}
		}
		settled := false
		defer func() {
			if !settled { // the handler panicked: the key is given up, and the panic goes on
				i.release(msg, key)
			}
		}()
		out, herr := h(msg)
		settled = true
		if herr != nil {
			i.release(msg, key)
			return out, herr
		}
		i.done(msg, key)
		return out, nil
	}
}

// logFields are the fields of a log line about msg and its key, made only when a line is
// written.
func logFields(msg *message.Message, key string) watermill.LogFields {
	return watermill.LogFields{"message_uuid": msg.UUID, "key": key}
}

// done records key as processed.
func (i *Idempotent) done(msg *message.Message, key string) {
	ctx, cancel := i.storeContext(msg)
	defer cancel()
	if err := i.cfg.Store.Done(ctx, key, i.cfg.Retention); err != nil {
		i.logger.Error("Idempotency store cannot record a processed key: a copy may be handled again", err, logFields(msg, key))
	}
}

// Polling of a busy key (see IdempotentConfig.BusyWait).
const (
	busyPollFirst = 20 * time.Millisecond
	busyPollMax   = 500 * time.Millisecond
)

// claim claims key, waiting up to BusyWait while another holder holds it. It returns Busy
// when the wait ends, when msg's context ends, or when its consumer stops (a lane given up to
// another process, say: the delivery goes back to its queue whatever the handler does, and
// the consumer's stop waits for its handlers).
func (i *Idempotent) claim(msg *message.Message, key string) (ClaimState, error) {
	ctx, cancel := i.storeContext(msg)
	state, err := i.cfg.Store.Claim(ctx, key)
	cancel()
	if err != nil || state != Busy {
		return state, err
	}
	deadline := time.NewTimer(i.cfg.BusyWait)
	defer deadline.Stop()
	stopping := contract.StoppingFrom(msg.Context()) // nil where the subscriber does not say
	pause := busyPollFirst
	for {
		next := time.NewTimer(pause)
		select {
		case <-next.C:
		case <-deadline.C:
			next.Stop()
			return Busy, nil
		case <-msg.Context().Done():
			next.Stop()
			return Busy, nil
		case <-stopping:
			next.Stop()
			return Busy, nil
		}
		pause = min(2*pause, busyPollMax)
		ctx, cancel := i.storeContext(msg)
		state, err := i.cfg.Store.Claim(ctx, key)
		cancel()
		if err != nil || state != Busy {
			return state, err
		}
	}
}

// release gives key up after a failure, so that a retry or a copy may take it.
func (i *Idempotent) release(msg *message.Message, key string) {
	ctx, cancel := i.storeContext(msg)
	defer cancel()
	if err := i.cfg.Store.Release(ctx, key); err != nil {
		i.logger.Error("Idempotency store cannot release a key: it is free once its lease ends", err, logFields(msg, key))
	}
}

// storeContext bounds a store call by Timeout, and is not ended by the message's own context:
// a claim taken must be settled even when the consumer is stopping.
func (i *Idempotent) storeContext(msg *message.Message) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(msg.Context()), i.cfg.Timeout)
}

// CopyKey is the key of one delivery of one attempt of a message published by warren: the
// queue it was consumed from and its publish id (warren.Delivery.PublishID, the same on
// every copy, derived for retries and outputs); "" for a message warren did not publish.
func CopyKey(msg *message.Message) string {
	d, ok := warren.DeliveryFrom(msg.Context())
	if !ok || d.PublishID == "" {
		return ""
	}
	return d.Queue + "\x00" + d.PublishID
}

// MessageIDKey is the key of a message by its id in the queue it was consumed from: the queue
// (ConsumedQueue) and msg.UUID, which is the AMQP message-id property (warren's publisher
// sends the UUID as the message-id; warren.Marshaler reads it back); "" for a message
// without one. Where CopyKey recognises the copies of one publish, which the broker and
// warren's publisher make (its publish id is new on every Publish call), MessageIDKey
// recognises a message that a producer sent twice, in two publishes, with the same id: a
// producer that timed out and sent again, an outbox relayed twice, a replay. A fan-out to
// two queues (consumer groups) is handled once in each.
//
// Use it around the handler, inside Backoff (see Idempotent), never outermost: a retry keeps
// the message id.
func MessageIDKey(msg *message.Message) string {
	if msg.UUID == "" {
		return ""
	}
	return ConsumedQueue(msg) + "\x00" + msg.UUID
}

// MemoryStore is an IdempotencyStore in the memory of one process: it recognises what this
// process processed. It holds at most MaxKeys processed keys; past that, the oldest go
// first.
type MemoryStore struct {
	max int

	mu    sync.Mutex
	held  map[string]struct{}
	done  map[string]time.Time // key → when it is forgotten
	order []memoryEntry        // processed keys in the order they were recorded
}

type memoryEntry struct {
	key   string
	until time.Time
}

// DefaultMemoryStoreMaxKeys is the default bound of a MemoryStore.
const DefaultMemoryStoreMaxKeys = 1_000_000

// NewMemoryStore returns a MemoryStore that remembers at most maxKeys processed keys
// (DefaultMemoryStoreMaxKeys when 0).
func NewMemoryStore(maxKeys int) (*MemoryStore, error) {
	if maxKeys < 0 {
		return nil, fmt.Errorf("middleware: NewMemoryStore: maxKeys %d is negative", maxKeys)
	}
	if maxKeys == 0 {
		maxKeys = DefaultMemoryStoreMaxKeys
	}
	return &MemoryStore{max: maxKeys, held: map[string]struct{}{}, done: map[string]time.Time{}}, nil
}

// Claim implements IdempotencyStore.
func (s *MemoryStore) Claim(_ context.Context, key string) (ClaimState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if until, ok := s.done[key]; ok && time.Now().Before(until) {
		return Processed, nil
	}
	if _, ok := s.held[key]; ok {
		return Busy, nil
	}
	s.held[key] = struct{}{}
	return Claimed, nil
}

// Done implements IdempotencyStore.
func (s *MemoryStore) Done(_ context.Context, key string, retention time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.held, key)
	now := time.Now()
	until := now.Add(retention)
	s.done[key] = until
	s.order = append(s.order, memoryEntry{key, until})
	for len(s.order) > 0 && (len(s.done) > s.max || !now.Before(s.order[0].until)) {
		e := s.order[0]
		s.order[0] = memoryEntry{}
		s.order = s.order[1:]
		if s.done[e.key].Equal(e.until) { // not recorded again since
			delete(s.done, e.key)
		}
	}
	return nil
}

// Release implements IdempotencyStore.
func (s *MemoryStore) Release(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.held, key)
	return nil
}
