// Package redisstore is a middleware.IdempotencyStore in Redis, shared by the processes of a
// service: with it, middleware.Idempotent (and router.Config.CopyStore) recognise a message
// handled by another process.
//
// A key is one Redis string under Config.Prefix: "h:<holder>" while a store holds it (taken
// with SET NX), "d" once processed (expiring after the retention). A claim expires after
// Config.Lease unless its store renews it, which it does every Lease/3 while it holds it: a
// process that was killed while it processed a message blocks that message's copies for at
// most Lease. The calls of many goroutines go to Redis together, one pipeline per batch, so
// that a busy consumer pays about one round trip per batch rather than two per message.
// Every command touches one key, so a Redis Cluster works too.
package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/middleware"
)

// Config configures a Store.
type Config struct {
	// Client is the Redis client (redis.NewClient, NewClusterClient, NewFailoverClient...).
	// Required; the Store does not close it.
	Client redis.UniversalClient
	// Prefix starts every key the Store writes. Default DefaultPrefix.
	Prefix string
	// Lease is how long a claim outlives its holder. Default DefaultLease.
	Lease time.Duration
}

// Defaults of Config.
const (
	DefaultPrefix = "warren:idem:"
	DefaultLease  = 15 * time.Second
)

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	return c
}

// Validate reports the first field of c that is not usable.
func (c Config) Validate() error {
	switch {
	case c.Client == nil:
		return errors.New("redisstore: Config.Client is nil")
	case c.Lease < 0:
		return fmt.Errorf("redisstore: Config.Lease %s is negative", c.Lease)
	case c.Lease > 0 && c.Lease < 100*time.Millisecond:
		return fmt.Errorf("redisstore: Config.Lease %s is below 100ms: claims would expire under their holders", c.Lease)
	}
	return nil
}

// Store is a middleware.IdempotencyStore in Redis. Calls from many goroutines at once go
// to Redis together, in one pipeline (one round trip) per batch; Done returns before its
// write, which follows in the next batch, while the claim it ends keeps the key from being
// taken. Close stops it.
type Store struct {
	cfg    Config
	logger watermill.LoggerAdapter
	holder string // "h:" and this Store's random id: the value of the keys it holds

	mu   sync.Mutex
	held map[string]struct{} // keys (with the prefix) this Store holds

	claims chan claimReq
	dones  chan doneReq
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

type claimReq struct {
	key   string // with the prefix
	reply chan claimReply
}

type claimReply struct {
	state middleware.ClaimState
	err   error
}

type doneReq struct {
	key       string
	retention time.Duration
}

// maxBatch bounds the commands of one pipeline.
const maxBatch = 512

// errClosed is the error of a Claim or Done on a closed Store.
var errClosed = fmt.Errorf("redisstore: store is %w", warren.ErrClosed)

var _ middleware.IdempotencyStore = (*Store)(nil)

// New returns a Store, or an error naming the first invalid field of config. It does not
// call Redis: a Redis that is down makes the calls fail, which middleware.Idempotent logs
// and survives.
func New(config Config, logger watermill.LoggerAdapter) (*Store, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	s := &Store{
		cfg: config.WithDefaults(), logger: logger, holder: "h:" + hex.EncodeToString(id),
		held:   map[string]struct{}{},
		claims: make(chan claimReq, maxBatch), dones: make(chan doneReq, maxBatch),
		stop: make(chan struct{}),
	}
	s.wg.Add(2)
	go s.run()
	go s.renew()
	return s, nil
}

// ifHeld runs ARGV[3] (PEXPIRE with ARGV[2] ms, or DEL) on KEYS[1] if ARGV[1] holds it.
var ifHeld = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[3] == 'del' then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])`)

// Claim implements middleware.IdempotencyStore.
func (s *Store) Claim(ctx context.Context, key string) (middleware.ClaimState, error) {
	if s.closed() {
		return 0, errClosed
	}
	req := claimReq{key: s.cfg.Prefix + key, reply: replies.Get().(chan claimReply)}
	select {
	case s.claims <- req:
	case <-ctx.Done():
		replies.Put(req.reply)
		return 0, fmt.Errorf("redisstore: claim: %w", context.Cause(ctx))
	case <-s.stop:
		replies.Put(req.reply)
		return 0, errClosed
	}
	select {
	case r := <-req.reply:
		replies.Put(req.reply)
		if r.state == middleware.Claimed {
			s.mu.Lock()
			s.held[req.key] = struct{}{} // renewed from now on, until done or released
			s.mu.Unlock()
		}
		return r.state, r.err
	case <-ctx.Done(): // a claim taken meanwhile is not renewed: it ends with its lease
		return 0, fmt.Errorf("redisstore: claim: %w", context.Cause(ctx)) // its reply channel is left to its late answer
	}
}

// replies are the reply channels of claims, used again once their reply is read.
var replies = sync.Pool{New: func() any { return make(chan claimReply, 1) }}

// Done implements middleware.IdempotencyStore. It returns once the write is queued; the key
// stays claimed until it is made.
func (s *Store) Done(ctx context.Context, key string, retention time.Duration) error {
	if s.closed() {
		return errClosed
	}
	select {
	case s.dones <- doneReq{key: s.cfg.Prefix + key, retention: retention}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("redisstore: done: %w", context.Cause(ctx))
	case <-s.stop:
		return errClosed
	}
}

// Release implements middleware.IdempotencyStore.
func (s *Store) Release(ctx context.Context, key string) error {
	k := s.cfg.Prefix + key
	s.forget(k)
	if err := ifHeld.Run(ctx, s.cfg.Client, []string{k}, s.holder, 0, "del").Err(); err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	return nil
}

func (s *Store) closed() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

func (s *Store) forget(keys ...string) {
	s.mu.Lock()
	for _, k := range keys {
		delete(s.held, k)
	}
	s.mu.Unlock()
}

// run sends the claims and dones waiting, in batches, until Close, and then the dones left.
func (s *Store) run() {
	defer s.wg.Done()
	for {
		var claims []claimReq
		var dones []doneReq
		select {
		case c := <-s.claims:
			claims = append(claims, c)
		case d := <-s.dones:
			dones = append(dones, d)
		case <-s.stop:
			for {
				select {
				case d := <-s.dones:
					dones = append(dones, d)
				default:
					s.batch(nil, dones)
					return
				}
			}
		}
	gather: // what else is waiting: batches grow while a round trip is under way
		for len(claims)+len(dones) < maxBatch {
			select {
			case c := <-s.claims:
				claims = append(claims, c)
			case d := <-s.dones:
				dones = append(dones, d)
			default:
				break gather
			}
		}
		s.batch(claims, dones)
	}
}

// batch writes dones, then tries claims (SET NX), in one pipeline; a claim that finds the key
// taken reads it (in a second one) to tell processed from held.
func (s *Store) batch(claims []claimReq, dones []doneReq) {
	if len(claims)+len(dones) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Lease/3)
	defer cancel()
	sets := make([]*redis.BoolCmd, len(claims))
	_, err := s.cfg.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, d := range dones {
			p.Set(ctx, d.key, "d", d.retention)
		}
		for i, c := range claims {
			sets[i] = p.SetNX(ctx, c.key, s.holder, s.cfg.Lease)
		}
		return nil
	})
	if len(dones) > 0 {
		keys := make([]string, len(dones))
		for i, d := range dones {
			keys[i] = d.key
		}
		s.forget(keys...) // written, or not: then the claim ends with its lease
		if err != nil {
			s.logger.Error("redisstore: cannot record processed keys: their copies may be handled again", err,
				watermill.LogFields{"keys": len(dones)})
		}
	}
	var taken []int
	for i, c := range claims {
		switch ok, cerr := sets[i].Result(); {
		case cerr != nil:
			c.reply <- claimReply{err: fmt.Errorf("redisstore: claim: %w", cerr)}
		case ok:
			c.reply <- claimReply{state: middleware.Claimed}
		default:
			taken = append(taken, i)
		}
	}
	if len(taken) == 0 {
		return
	}
	gets := make([]*redis.StringCmd, len(taken))
	_, _ = s.cfg.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, i := range taken {
			gets[j] = p.Get(ctx, claims[i].key)
		}
		return nil
	})
	for j, i := range taken {
		v, gerr := gets[j].Result()
		switch {
		case gerr == nil && v == "d":
			claims[i].reply <- claimReply{state: middleware.Processed}
		case gerr == nil || errors.Is(gerr, redis.Nil): // held; or freed just now: try again later
			claims[i].reply <- claimReply{state: middleware.Busy}
		default:
			claims[i].reply <- claimReply{err: fmt.Errorf("redisstore: claim: %w", gerr)}
		}
	}
}

// renew extends the leases of the keys held, every Lease/3, until Close.
func (s *Store) renew() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		keys := make([]string, 0, len(s.held))
		for k := range s.held {
			keys = append(keys, k)
		}
		s.mu.Unlock()
		if len(keys) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Lease/3)
		_, err := s.cfg.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				ifHeld.Eval(ctx, p, []string{k}, s.holder, s.cfg.Lease.Milliseconds(), "pexpire")
			}
			return nil
		})
		cancel()
		if err != nil {
			s.logger.Error("redisstore: cannot renew the leases of the keys held", err, watermill.LogFields{"keys": len(keys)})
		}
	}
}

// Close writes the Done calls queued, and stops renewing leases: claims still held expire
// after Lease. It does not close the Client.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.stop) })
	s.wg.Wait()
	return nil
}
