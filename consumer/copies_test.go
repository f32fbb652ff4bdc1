package consumer

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A publish id is claimed once while it is handled, and never again once acked; one nacked
// may be handled again; a delivery without one always is.
func TestCopies(t *testing.T) {
	c := &copies{seen: &seenIDs{}, live: map[uint64]int{}}
	assert.True(t, c.claim(""))
	assert.True(t, c.claim(""))

	assert.True(t, c.claim("a1"))
	assert.False(t, c.claim("a1"), "being handled")
	c.release("a1", false)
	assert.True(t, c.claim("a1"), "nacked: handled again")
	c.release("a1", true)
	assert.False(t, c.claim("a1"), "acked")
	assert.True(t, c.claim("a1/2"), "a retry's id is its own")
	assert.Len(t, c.live, 1, "a1/2")
}

// The ids acked are remembered for two generations of seenMax each.
func TestSeenIDsGenerations(t *testing.T) {
	s := &seenIDs{}
	for i := range seenMax + 1 {
		s.add(idHash(strconv.Itoa(i)))
	}
	assert.True(t, s.has(idHash("0")), "in the previous generation")
	for i := range seenMax {
		s.add(idHash("x" + strconv.Itoa(i)))
	}
	assert.False(t, s.has(idHash("0")), "two generations later")
	assert.True(t, s.has(idHash(strconv.Itoa(seenMax))))
}
