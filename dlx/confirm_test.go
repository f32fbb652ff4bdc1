package dlx

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/warrenmq/warren/internal/amqpx"
)

// The confirmer's errors (internal/amqpx) are dlx's: errors.As and errors.Is find them by
// dlx's names. A return is permanent, a nack is not.
func TestReturnedAndNackedAreDlxErrors(t *testing.T) {
	err := fmt.Errorf("message m1: %w", &amqpx.ReturnedError{Exchange: "orders", RoutingKey: "created", ReplyCode: 312, ReplyText: "NO_ROUTE"})
	var ret *ReturnedError
	assert.True(t, errors.As(err, &ret))
	assert.Equal(t, ReturnedError{Exchange: "orders", RoutingKey: "created", ReplyCode: 312, ReplyText: "NO_ROUTE"}, *ret)
	assert.True(t, isPermanent(err))

	nacked := fmt.Errorf("message m2: %w", amqpx.ErrNacked)
	assert.ErrorIs(t, nacked, ErrNacked)
	assert.False(t, isPermanent(nacked))
}
