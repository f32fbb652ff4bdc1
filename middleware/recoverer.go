package middleware

import (
	"runtime/debug"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Recoverer turns a panic in the handler into a *PanicError that keeps the stack, so that
// the message is retried and, past the limit, poisoned with the stack in its headers.
func Recoverer(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (msgs []*message.Message, err error) {
		defer func() {
			if r := recover(); r != nil {
				msgs, err = nil, &PanicError{Value: r, Stack: string(debug.Stack())}
			}
		}()
		return h(msg)
	}
}
