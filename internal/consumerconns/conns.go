// Package consumerconns holds the connections that the Subscribers of package consumer consume
// on: a Subscriber's own, or those a router shares among its handlers' Subscribers
// (consumer.NewSubscriberOn). It is not part of warren's API: a user's Subscriber has
// connections of its own (see warren.Connection).
package consumerconns

import (
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
)

// Conns are the connections that subscriptions consume on: a router's, which all its
// handlers' Subscribers share, or a Subscriber's own. Each subscription consumes on Main, on a
// channel of its own, and listens to its kill topic and reads its kill state on channels of
// Main too; a failure of its channel (a deleted queue, a consumer cancelled, a refusal that
// closes the channel) is its own, and the others go on.
//
// A refusal that closes the whole connection is not: RabbitMQ answers basic.consume on a
// quorum queue that is down with 541 INTERNAL_ERROR, a connection error. The subscription
// whose consume was refused so moves to Isolated, a connection that only such subscriptions
// use (dialed when the first one needs it), and consumes there, so that its retries, once a
// second, never cut the other subscriptions' deliveries short; once it has consumed there, its
// next session (after that connection or its channel is lost) is on Main again. To tell whose
// consume the refusal was, consumes on one connection are made one at a time (Consuming).
type Conns struct {
	Main, Isolated *Conn
	// Publish is where subscriptions publish what they publish themselves (the poison copy
	// of an undecodable delivery, answers to kill commands): the router's publishing
	// connection, or Main for a Subscriber of its own.
	Publish *amqpx.Conn
}

// Conn is a connection that subscriptions consume on.
type Conn struct {
	*amqpx.Conn
	Consuming sync.Mutex // held around basic.consume, see Conns
}

// New returns the connections of name (Main; Isolated, dialed when needed, is
// name + " (isolated)"), which publish on publish, or on Main when publish is nil. The
// subscriptions log a lost connection, once per retry: the Dialers log it at Debug only.
func New(c warren.Connection, name string, publish *amqpx.Conn, logger watermill.LoggerAdapter) *Conns {
	cc := &Conns{
		Main:     &Conn{Conn: amqpx.NewConn(amqpx.NewDialer(c, name, logger).OwnerReportsLoss())},
		Isolated: &Conn{Conn: amqpx.NewConn(amqpx.NewDialer(c, name+" (isolated)", logger).OwnerReportsLoss())},
		Publish:  publish,
	}
	if cc.Publish == nil {
		cc.Publish = cc.Main.Conn
	}
	return cc
}

// Close closes the consuming connections (not Publish, unless it is Main).
func (cc *Conns) Close() error {
	return errors.Join(cc.Main.Close(), cc.Isolated.Close())
}
