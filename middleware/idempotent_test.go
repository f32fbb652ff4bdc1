package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
)

func delivered(queue, publishID string) *message.Message {
	msg := message.NewMessage("m1", nil)
	msg.SetContext(contract.WithDelivery(context.Background(), contract.Delivery{Queue: queue, PublishID: publishID}))
	return msg
}

func newIdempotent(t *testing.T, store middleware.IdempotencyStore) *middleware.Idempotent {
	t.Helper()
	i, err := middleware.NewIdempotent(middleware.IdempotentConfig{Store: store}, nil)
	require.NoError(t, err)
	return i
}

func TestCopyKeyIsQueueAndPublishID(t *testing.T) {
	assert.Equal(t, "q\x00abc/2", middleware.CopyKey(delivered("q", "abc/2")))
	assert.NotEqual(t, middleware.CopyKey(delivered("q1", "abc")), middleware.CopyKey(delivered("q2", "abc")),
		"a fan-out delivers one publish to two queues: each handles it")
	assert.Empty(t, middleware.CopyKey(delivered("q", "")), "not published by warren")
	assert.Empty(t, middleware.CopyKey(message.NewMessage("m", nil)), "not from warren's subscriber")
}

func TestIdempotentHandlesAKeyOnce(t *testing.T) {
	store, err := middleware.NewMemoryStore(0)
	require.NoError(t, err)
	i := newIdempotent(t, store)
	calls := 0
	h := i.Middleware(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })

	_, err = h(delivered("q", "p1"))
	require.NoError(t, err)
	_, err = h(delivered("q", "p1"))
	require.NoError(t, err, "a processed copy is acked")
	assert.Equal(t, 1, calls)

	_, err = h(delivered("q", "p1/2"))
	require.NoError(t, err)
	_, err = h(delivered("q", ""))
	require.NoError(t, err)
	_, err = h(delivered("q", ""))
	require.NoError(t, err)
	assert.Equal(t, 4, calls, "another attempt is another key; messages without a key are always handled")
}

func TestIdempotentReleasesAKeyOnFailure(t *testing.T) {
	store, err := middleware.NewMemoryStore(0)
	require.NoError(t, err)
	i := newIdempotent(t, store)
	fail := errors.New("boom")
	calls := 0
	h := i.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		if calls == 1 {
			return nil, fail
		}
		return nil, nil
	})
	_, err = h(delivered("q", "p"))
	require.ErrorIs(t, err, fail)
	_, err = h(delivered("q", "p"))
	require.NoError(t, err)
	_, err = h(delivered("q", "p"))
	require.NoError(t, err)
	assert.Equal(t, 2, calls, "a failure gives the key up; a success keeps it")
}

// countingStore counts the Busy answers of its store.
type countingStore struct {
	middleware.IdempotencyStore
	busy atomic.Int32
}

func (s *countingStore) Claim(ctx context.Context, key string) (middleware.ClaimState, error) {
	st, err := s.IdempotencyStore.Claim(ctx, key)
	if st == middleware.Busy {
		s.busy.Add(1)
	}
	return st, err
}

// blockingHandler returns a handler guarded by i that, on its first call, signals inside and
// waits for release, then returns result.
func blockingHandler(i *middleware.Idempotent, calls *atomic.Int32, inside, release chan struct{}, result error) message.HandlerFunc {
	return i.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			close(inside)
			<-release
			return nil, result
		}
		return nil, nil
	})
}

// A twin of a message being handled waits for the holder, asking the store again, and is
// acked once the holder is done (processed), or handled once the holder failed.
func TestIdempotentTwinWaitsForTheHolder(t *testing.T) {
	for _, tc := range []struct {
		name      string
		holderErr error
		wantCalls int32
	}{
		{"holder_succeeds", nil, 1},
		{"holder_fails", errors.New("boom"), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, err := middleware.NewMemoryStore(0)
			require.NoError(t, err)
			store := &countingStore{IdempotencyStore: mem}
			i := newIdempotent(t, store)
			inside, release := make(chan struct{}), make(chan struct{})
			var calls atomic.Int32
			h := blockingHandler(i, &calls, inside, release, tc.holderErr)
			holder := make(chan error)
			go func() {
				_, err := h(delivered("q", "p"))
				holder <- err
			}()
			<-inside
			twin := make(chan error)
			go func() {
				_, err := h(delivered("q", "p"))
				twin <- err
			}()
			require.Eventually(t, func() bool { return store.busy.Load() >= 2 }, testenv.Patience(), time.Millisecond,
				"the twin finds the key busy, and asks again")
			close(release)
			require.ErrorIs(t, <-holder, tc.holderErr)
			require.NoError(t, <-twin)
			assert.Equal(t, tc.wantCalls, calls.Load())
		})
	}
}

// A twin that waited BusyWait in vain goes back to its queue; so does one whose consumer
// stops while it waits.
func TestIdempotentRequeuesATwinAfterBusyWait(t *testing.T) {
	store, err := middleware.NewMemoryStore(0)
	require.NoError(t, err)
	i, err := middleware.NewIdempotent(middleware.IdempotentConfig{Store: store, BusyWait: 50 * time.Millisecond}, nil)
	require.NoError(t, err)
	inside, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	h := blockingHandler(i, &calls, inside, release, nil)
	done := make(chan error)
	go func() {
		_, err := h(delivered("q", "p"))
		done <- err
	}()
	<-inside
	_, err = h(delivered("q", "p"))
	var rq *middleware.RequeueError
	require.ErrorAs(t, err, &rq, "the twin goes back to the queue, to be tried later")

	stopping, stop := context.WithCancel(context.Background())
	msg := delivered("q", "p")
	msg.SetContext(contract.WithDelivery(stopping, contract.Delivery{Queue: "q", PublishID: "p"}))
	stop()
	slow, err := middleware.NewIdempotent(middleware.IdempotentConfig{Store: store, BusyWait: time.Hour}, nil)
	require.NoError(t, err)
	_, err = slow.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
	require.ErrorAs(t, err, &rq, "a consumer that stops does not wait")

	given := make(chan struct{}) // a lane given up: the consumer stops, the message's context lives on
	msg = delivered("q", "p")
	msg.SetContext(contract.WithHandling(context.Background(), &contract.Handling{Delivery: contract.Delivery{Queue: "q", PublishID: "p"}, Stopping: given}))
	time.AfterFunc(20*time.Millisecond, func() { close(given) })
	_, err = slow.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
	require.ErrorAs(t, err, &rq, "a consumer that stops while the context lives does not wait either")

	close(release)
	require.NoError(t, <-done)
	_, err = h(delivered("q", "p"))
	require.NoError(t, err)
	assert.EqualValues(t, 1, calls.Load())
}

// failingStore fails every call.
type failingStore struct{ calls atomic.Int32 }

func (s *failingStore) Claim(context.Context, string) (middleware.ClaimState, error) {
	s.calls.Add(1)
	return 0, errors.New("store down")
}
func (s *failingStore) Done(context.Context, string, time.Duration) error { return errors.New("down") }
func (s *failingStore) Release(context.Context, string) error             { return errors.New("down") }

func TestIdempotentHandlesWithoutAFailingStore(t *testing.T) {
	store := &failingStore{}
	i := newIdempotent(t, store)
	calls := 0
	h := i.Middleware(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })
	for range 2 {
		_, err := h(delivered("q", "p"))
		require.NoError(t, err)
	}
	assert.Equal(t, 2, calls, "a store that fails never holds a message up: at least once")
	assert.EqualValues(t, 2, store.calls.Load())
}

func TestMemoryStoreForgetsAfterRetention(t *testing.T) {
	store, err := middleware.NewMemoryStore(0)
	require.NoError(t, err)
	ctx := context.Background()
	st, err := store.Claim(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, middleware.Claimed, st)
	require.NoError(t, store.Done(ctx, "k", 20*time.Millisecond))
	st, _ = store.Claim(ctx, "k")
	require.Equal(t, middleware.Processed, st)
	// Not a wait for an event: the 20 ms retention must pass in real time (MemoryStore reads
	// time.Now and takes no clock).
	time.Sleep(30 * time.Millisecond)
	st, _ = store.Claim(ctx, "k")
	assert.Equal(t, middleware.Claimed, st, "a key past its retention is new again")
}

func TestMemoryStoreIsBounded(t *testing.T) {
	store, err := middleware.NewMemoryStore(100)
	require.NoError(t, err)
	ctx := context.Background()
	for n := range 1000 {
		k := fmt.Sprint(n)
		_, _ = store.Claim(ctx, k)
		require.NoError(t, store.Done(ctx, k, time.Hour))
	}
	processed := 0
	for n := range 1000 {
		if st, _ := store.Claim(ctx, fmt.Sprint(n)); st == middleware.Processed {
			processed++
		}
	}
	assert.Equal(t, 100, processed, "the newest 100 are kept, the oldest went")
	st, _ := store.Claim(ctx, "999")
	assert.Equal(t, middleware.Processed, st)
}

func TestMemoryStoreClaimsOnce(t *testing.T) {
	store, err := middleware.NewMemoryStore(0)
	require.NoError(t, err)
	var claimed atomic.Int32
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if st, _ := store.Claim(context.Background(), "k"); st == middleware.Claimed {
				claimed.Add(1)
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, 1, claimed.Load())
}

func TestIdempotentConfigIsValidatedNamingTheField(t *testing.T) {
	_, err := middleware.NewIdempotent(middleware.IdempotentConfig{}, nil)
	require.ErrorContains(t, err, "IdempotentConfig.Store")
	store, _ := middleware.NewMemoryStore(0)
	_, err = middleware.NewIdempotent(middleware.IdempotentConfig{Store: store, Retention: -time.Second}, nil)
	require.ErrorContains(t, err, "IdempotentConfig.Retention")
	_, err = middleware.NewMemoryStore(-1)
	require.ErrorContains(t, err, "maxKeys")
}

func TestMessageIDKeyIsQueueAndMessageID(t *testing.T) {
	a, b := delivered("q", "p1"), delivered("q", "p2")
	a.UUID, b.UUID = "order-42", "order-42"
	assert.Equal(t, "q\x00order-42", middleware.MessageIDKey(a))
	assert.Equal(t, middleware.MessageIDKey(a), middleware.MessageIDKey(b),
		"two publishes of one message id are one key (CopyKey tells them apart)")
	assert.NotEqual(t, middleware.CopyKey(a), middleware.CopyKey(b))
	c := delivered("q2", "p1")
	c.UUID = "order-42"
	assert.NotEqual(t, middleware.MessageIDKey(a), middleware.MessageIDKey(c), "each consumer group handles it")
	a.UUID = ""
	assert.Empty(t, middleware.MessageIDKey(a), "a message without an id is always handled")
}

// A handler that panics gives its key up (Recoverer sits outside the handler's own
// middleware): the message is not held as "being processed" for ever.
func TestIdempotentReleasesAKeyOnPanic(t *testing.T) {
	store, err := middleware.NewMemoryStore(0)
	require.NoError(t, err)
	i := newIdempotent(t, store)
	calls := 0
	h := middleware.Recoverer(i.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		if calls == 1 {
			panic("boom")
		}
		return nil, nil
	}))
	_, err = h(delivered("q", "p"))
	var p *middleware.PanicError
	require.ErrorAs(t, err, &p)
	_, err = h(delivered("q", "p"))
	require.NoError(t, err, "released: claimed again, not busy")
	assert.Equal(t, 2, calls)
}
