package router

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"

	"github.com/warrenmq/warren/internal/contract"
)

// settlements records what a message was settled as.
type settlements struct{ got []bool }

func (s *settlements) Settle(acked bool) { s.got = append(s.got, acked) }

// The router's handler settles every message once, as Watermill's handler acks or nacks it:
// what the chain did to the message itself counts.
func TestSettling(t *testing.T) {
	failed := errors.New("failed")
	for name, c := range map[string]struct {
		handle func(*message.Message) error
		acked  bool
		panics bool
	}{
		"succeeded":         {func(*message.Message) error { return nil }, true, false},
		"failed":            {func(*message.Message) error { return failed }, false, false},
		"nacked, succeeded": {func(m *message.Message) error { m.Nack(); return nil }, false, false},
		"acked, failed":     {func(m *message.Message) error { m.Ack(); return failed }, true, false},
		"panicked":          {func(*message.Message) error { panic("boom") }, false, true},
	} {
		t.Run(name, func(t *testing.T) {
			s := &settlements{}
			msg := message.NewMessage("id", nil)
			msg.SetContext(contract.WithHandling(context.Background(), &contract.Handling{Settler: s}))
			run := func() {
				_ = settling(func(m *message.Message) ([]*message.Message, error) { return nil, c.handle(m) })(msg)
			}
			if c.panics {
				assert.Panics(t, run, "the panic goes on to Watermill's handler")
			} else {
				run()
			}
			assert.Equal(t, []bool{c.acked}, s.got)
		})
	}
}
