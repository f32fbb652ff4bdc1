package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/middleware/redisstore"
)

// TestMain runs a consumer process of the multi-process tests when the test binary is
// started as one (see consumerMain); otherwise the tests, checking for leaked goroutines.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == childValue {
		os.Exit(consumerMain())
	}
	goleak.VerifyTestMain(m)
}

// newStores returns n Stores on the test Redis, as n processes would have, under a prefix of
// the test's own (deleted when it ends).
func newStores(t *testing.T, n int, lease time.Duration) []*redisstore.Store {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "warren:test:" + t.Name() + ":" + hex.EncodeToString(b) + ":"
	client := testenv.Redis(t, prefix)
	stores := make([]*redisstore.Store, n)
	for i := range stores {
		s, err := redisstore.New(redisstore.Config{Client: client, Prefix: prefix, Lease: lease}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		stores[i] = s
	}
	return stores
}

func claim(t *testing.T, s *redisstore.Store, key string) middleware.ClaimState {
	t.Helper()
	st, err := s.Claim(context.Background(), key)
	require.NoError(t, err)
	return st
}

func TestClaimDoneRelease(t *testing.T) {
	t.Parallel()
	s := newStores(t, 2, 0)
	ctx := context.Background()
	require.Equal(t, middleware.Claimed, claim(t, s[0], "k"))
	assert.Equal(t, middleware.Busy, claim(t, s[1], "k"), "held by another process")
	assert.Equal(t, middleware.Busy, claim(t, s[0], "k"), "held by this process: a twin waits too")

	require.NoError(t, s[1].Release(ctx, "k"))
	assert.Equal(t, middleware.Busy, claim(t, s[1], "k"), "a release by a store that does not hold it does nothing")
	require.NoError(t, s[0].Release(ctx, "k"))
	require.Equal(t, middleware.Claimed, claim(t, s[1], "k"), "released: free")

	require.NoError(t, s[1].Done(ctx, "k", time.Minute))
	// Done is written in the store's next batch; until then the claim holds the key.
	require.Eventually(t, func() bool { return claim(t, s[0], "k") == middleware.Processed }, testenv.Patience(), 5*time.Millisecond)
	assert.Equal(t, middleware.Processed, claim(t, s[1], "k"))
}

// Not parallel: the key must be seen processed within its 300 ms retention.
func TestProcessedKeyIsForgottenAfterRetention(t *testing.T) {
	s := newStores(t, 1, 0)[0]
	require.Equal(t, middleware.Claimed, claim(t, s, "k"))
	require.NoError(t, s.Done(context.Background(), "k", 300*time.Millisecond))
	require.Eventually(t, func() bool { return claim(t, s, "k") == middleware.Processed }, testenv.Patience(), 5*time.Millisecond)
	require.Eventually(t, func() bool { return claim(t, s, "k") == middleware.Claimed }, testenv.Patience(), 20*time.Millisecond)
}

// A process killed while it held a key (its Store no longer renews) blocks the key for at
// most Lease; a live holder keeps it however long it takes.
//
// Not parallel: the live holder must renew its 300 ms lease in time.
func TestClaimOfAGoneHolderExpiresAfterTheLease(t *testing.T) {
	const lease = time.Second // renewed every lease/3: 300ms missed a renewal once with the RabbitMQ 4 tests loading both cores
	s := newStores(t, 3, lease)
	require.Equal(t, middleware.Claimed, claim(t, s[0], "gone"))
	require.Equal(t, middleware.Claimed, claim(t, s[1], "alive"))
	require.NoError(t, s[0].Close()) // the process dies
	gone := time.Now()
	require.Eventually(t, func() bool { return claim(t, s[2], "gone") == middleware.Claimed }, testenv.Patience(), 10*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(gone), lease/3, "not freed before its lease could end")

	assert.Never(t, func() bool {
		st, err := s[2].Claim(context.Background(), "alive")
		return err != nil || st != middleware.Busy
	}, 4*lease, lease/10, "renewed by its live holder, the key stays busy")
}

func TestOneOfManyConcurrentClaimsWins(t *testing.T) {
	t.Parallel()
	s := newStores(t, 3, 0)
	for k := range 20 {
		key := "k" + string(rune('a'+k))
		var claimed atomic.Int32
		var wg sync.WaitGroup
		for i := range 30 {
			wg.Go(func() {
				if claim(t, s[i%3], key) == middleware.Claimed {
					claimed.Add(1)
				}
			})
		}
		wg.Wait()
		assert.EqualValues(t, 1, claimed.Load(), key)
	}
}

func TestConfigIsValidatedNamingTheField(t *testing.T) {
	_, err := redisstore.New(redisstore.Config{}, nil)
	require.ErrorContains(t, err, "Config.Client")
	client := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer client.Close()
	_, err = redisstore.New(redisstore.Config{Client: client, Lease: time.Millisecond}, nil)
	require.ErrorContains(t, err, "Config.Lease")
}

// A Redis that does not answer makes Claim and Release fail (Idempotent then handles the
// message without the store) within the caller's context; Done is queued, and its failure
// logged.
func TestRedisDownIsAnError(t *testing.T) {
	t.Parallel()
	testenv.Slow(t)
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer client.Close()
	s, err := redisstore.New(redisstore.Config{Client: client}, nil)
	require.NoError(t, err)
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
	defer cancel()
	_, err = s.Claim(ctx, "k")
	require.ErrorContains(t, err, "redisstore: claim")
	require.Error(t, s.Release(ctx, "k"))
	require.NoError(t, s.Close())
	_, err = s.Claim(ctx, "k")
	require.ErrorIs(t, err, warren.ErrClosed)
	require.ErrorIs(t, s.Done(ctx, "k", time.Minute), warren.ErrClosed)
}
