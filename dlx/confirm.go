package dlx

import (
	"errors"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
)

// ErrNacked is wrapped by the error of a publishing the broker nacked.
var ErrNacked = amqpx.ErrNacked

// ReturnedError is the error of a mandatory publishing the broker could not route: its
// fields Exchange and RoutingKey say where it went, ReplyCode and ReplyText why the broker
// returned it.
type ReturnedError = amqpx.ReturnedError

// isPermanent reports whether a Publish error is one that publishing again cannot cure: a
// message too large or with invalid delay metadata, a message the broker returned (no queue
// takes it) or a refusal by the broker (access refused, a missing exchange). Publish marks
// these warren.Permanent. Other errors (a lost connection, a nack, the time limit) may pass.
func isPermanent(err error) bool {
	var ret *ReturnedError
	return errors.Is(err, warren.ErrTooLarge) || errors.Is(err, warren.ErrInvalidDelay) || errors.As(err, &ret) ||
		amqpx.IsPermanentBrokerError(err)
}
