package testenv

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// DefaultPatience is Patience's default.
const DefaultPatience = time.Minute

var patience = sync.OnceValue(func() time.Duration {
	v := os.Getenv("WARREN_TEST_PATIENCE")
	if v == "" {
		return DefaultPatience
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		panic(fmt.Sprintf("testenv: WARREN_TEST_PATIENCE=%q: want a positive Go duration such as 2m", v))
	}
	return d
})

// Patience is how long a test waits for something outside it (the broker, a router, another
// process) to happen before it fails: the one setting every such wait in the tests derives
// from, $WARREN_TEST_PATIENCE (a Go duration) or DefaultPatience. A wait returns as soon as
// what it waits for has happened, so patience costs a passing test nothing; it is long
// because a loaded machine (two CPU-bound processes beside the tests on 2 cores) makes a
// broker's round trips take seconds. What a test checks does not happen within a window
// (assert.Never) is not a wait: its window is its own.
func Patience() time.Duration { return patience() }
