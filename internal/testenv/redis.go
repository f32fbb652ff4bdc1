package testenv

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// RedisAddr is the Redis the tests use: $WARREN_REDIS_ADDR, or the local one.
func RedisAddr() string {
	if a := os.Getenv("WARREN_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// Redis returns a client of RedisAddr, failing t if Redis does not answer (it is never a
// skip), and deletes, when t ends, every key that starts with prefix.
func Redis(t testing.TB, prefix string) *redis.Client {
	t.Helper()
	NeedsBroker(t)
	c := redis.NewClient(&redis.Options{Addr: RedisAddr()})
	ctx, cancel := context.WithTimeout(context.Background(), Patience())
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("no Redis at %s (start it with `make redis`): %v", RedisAddr(), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), Patience())
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		_ = c.Close()
	})
	return c
}
