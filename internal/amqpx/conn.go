package amqpx

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrConnClosed is the error of Conn.Get once the Conn is closed.
var ErrConnClosed = errors.New("the connection is closed")

// Conn is one connection that several users share, each on channels of its own: the
// connection of one role of a component (a router consumes on one and publishes on another).
// It is dialed by its Dialer when a user needs it and none is open, so that a lost connection
// is opened again once, at the first user's call, with one report of each event; the users
// notice the loss themselves (their channels close) and call Get again.
type Conn struct {
	dialer  *Dialer
	dialing chan struct{} // one slot: held while dialing

	mu     sync.Mutex
	conn   *amqp.Connection
	closed bool
}

// NewConn returns a Conn that dials with d. It dials nothing yet.
func NewConn(d *Dialer) *Conn {
	return &Conn{dialer: d, dialing: make(chan struct{}, 1)}
}

// Get returns the open connection, or dials one (see Dialer.Dial) when there is none. One
// call at a time dials, bounded by its ctx; the others wait for it, each until its own ctx
// ends, and use what it opened (or dial in turn when it failed). A failed dial's error
// starts with "dial: "; after Close the error is ErrConnClosed.
func (c *Conn) Get(ctx context.Context) (*amqp.Connection, error) {
	if conn, err := c.open(); conn != nil || err != nil {
		return conn, err
	}
	release, err := Take(ctx, c.dialing, "dial")
	if err != nil {
		return nil, err
	}
	defer release()
	if conn, err := c.open(); conn != nil || err != nil { // opened while this call waited
		return conn, err
	}
	conn, err := c.dialer.Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = conn.Close()
		return nil, ErrConnClosed
	}
	c.conn = conn
	return conn, nil
}

// open returns the open connection, nil if there is none, or ErrConnClosed.
func (c *Conn) open() (*amqp.Connection, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return nil, ErrConnClosed
	case c.conn != nil && !c.conn.IsClosed():
		return c.conn, nil
	}
	return nil, nil
}

// Current returns the open connection, or nil when there is none (it never dials).
func (c *Conn) Current() *amqp.Connection {
	conn, _ := c.open()
	return conn
}

// Close closes the connection (see Close, the function) and makes Get fail from now on;
// what is in flight on its channels fails. Close may be called more than once.
func (c *Conn) Close() error {
	c.mu.Lock()
	conn, closed := c.conn, c.closed
	c.closed = true
	c.mu.Unlock()
	if closed {
		return nil
	}
	return Close(conn)
}

// Take takes the one slot of slot (a channel of capacity 1), waiting for another call's what
// until ctx ends, and returns the function that gives it back.
func Take(ctx context.Context, slot chan struct{}, what string) (release func(), err error) {
	select {
	case slot <- struct{}{}:
		return func() { <-slot }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for another call's %s: %w", what, context.Cause(ctx))
	}
}
