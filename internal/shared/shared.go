// Package shared hands package router what package dlx does not export: DLX publishers that
// publish on a connection they share (a router's publishing connection), each on a confirm
// channel of its own. It is not part of warren's API: a user's publishers each have a
// connection of their own (see warren.Connection).
package shared

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren/internal/amqpx"
)

// NewPublisher returns a *dlx.Publisher of config (a dlx.Config, validated as
// dlx.NewPublisher does; its Connection's ConnectTimeout bounds declaring, while dialing is
// conn's) that publishes on conn: it never closes conn, which its owner closes once every
// publisher on it is closed. With declare set it connects and declares the delay levels and
// config.Declare now, and reports the warren.delay.parked gauge, as dlx.NewPublisher does;
// without, it does neither and connects at its first publish: for the publishers that share
// the connection of one that declared. Set by package dlx when it is initialised.
var NewPublisher func(config any, conn *amqpx.Conn, declare bool, logger watermill.LoggerAdapter) (message.Publisher, error)
