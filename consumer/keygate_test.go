package consumer

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A key's messages are handed out one at a time, in the order delivered; other keys are not
// held; a message to requeue keeps its key held; drop ends what waits.
func TestKeyGate(t *testing.T) {
	g := newKeyGate()
	var ended []string
	h := func(key, id string) *handout {
		return &handout{key: key, id: id, done: func() { ended = append(ended, id) }}
	}
	a1, a2, a3, b1 := h("a", "a1"), h("a", "a2"), h("a", "a3"), h("b", "b1")
	assert.True(t, g.admit(a1))
	assert.False(t, g.admit(a2))
	assert.False(t, g.admit(a3))
	assert.True(t, g.admit(b1), "another key goes on")
	assert.Nil(t, g.next())

	g.settled(a1, false)
	assert.Same(t, a2, g.next(), "the key's next, in order")
	assert.Nil(t, g.next())
	g.settled(b1, false)
	assert.True(t, g.admit(h("b", "b2")), "b is free again")

	g.settled(a2, true) // to be requeued: a stays held
	assert.Nil(t, g.next())
	assert.False(t, g.admit(h("a", "a4")))
	g.drop()
	assert.ElementsMatch(t, []string{"a3", "a4"}, ended)
}
