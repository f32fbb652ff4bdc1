// Package billing is a service of one handler, as an application has it; billing_test.go is
// the test to copy: it runs the service against warrentest's in-memory broker, on a fake
// clock, so that retries after 1 s and 5 s take no time (`go test ./examples/testing`).
package billing

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/handlers"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
)

// Queue is the queue the service handles.
const Queue = "billing"

// Order is what the service is asked to charge.
type Order struct {
	ID    int `json:"id"`
	Cents int `json:"cents"`
}

// New returns the service's router on conn: charge is called for each order, and a failure
// is tried again after 1 s, then after 5 s; a third one sends the order to billing.poison.
func New(conn warren.Connection, charge func(context.Context, Order) error, logger watermill.LoggerAdapter) (*router.Router, error) {
	r, err := router.New(router.Config{
		Connection: conn,
		Retry:      middleware.BackoffConfig{Delays: []time.Duration{time.Second, 5 * time.Second}},
	}, logger)
	if err != nil {
		return nil, err
	}
	if err := r.AddConsumerHandler(router.HandlerConfig{Queue: Queue}, handlers.JSON(charge)); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}
