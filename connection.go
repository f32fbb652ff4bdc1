package warren

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpurl"
)

// Connection says how to reach the broker. Every part of warren that connects takes one, in
// a field named Connection (dlx.Config, router.Config, consumer.Config, kill.Config,
// rpc.ClientConfig, ops.Config, ledger.Config, scheduler.Config) or, for
// topology.Builder's Apply and Verify, as an argument.
//
// Every connection is opened the same way: the nodes of URL are tried in a random order, each
// with a share of the time left, and when none answers the attempt is repeated with
// exponential backoff and jitter (from 50ms, at most 2s apart) until ConnectTimeout. A
// connection that is lost is opened again the same way, on whichever node answers first.
//
// What retrying cannot change fails the first attempt, with the broker's reason (an
// *amqp.Error, amqp.ErrCredentials, or crypto/tls's and x509's errors, reachable with
// errors.Is and errors.As) and the node's URL without its password: a wrong user or password
// (RabbitMQ answers it after about 3s), a vhost that does not exist or that the user may not
// use (a connection limit reached is retried), a certificate that fails verification. Of
// several nodes, the broker's refusal of a login or vhost ends the attempt (the cluster's
// nodes share their users and vhosts), while a certificate, which is one node's, lets the
// other nodes be tried. Once a component has connected, a connection closed without a word
// after the login is taken for a node that stopped during the handshake, and retried.
//
// Connections belong to a component and a role in it, and are never shared between
// components. A router.Router holds two, whatever its number of handlers: one it consumes on
// ("warren subscriber": every handler on channels of its own) and one it publishes on
// ("warren publisher": Router.Publisher, what handlers return, retries, poison copies,
// replies), plus a third ("warren subscriber (isolated)") only while a handler's consume is
// refused with an error that closes the whole connection. Every other component opens its
// own when it is made on its own (a dlx.Publisher, an rpc.Client, a consumer.Subscriber, a
// kill.Killer, an ops.Ops, a ledger.Ledger, another Router; a scheduler.Scheduler holds
// two, one to lead its group and its dlx.Publisher's; topology.Builder's Apply and Verify one
// for the call), even from the same Connection value in the same process.
// The reasons: Close of one component ends its own connections only; a connection that the
// broker blocks (flow control, an alarm: it blocks connections that publish) or closes (a
// refusal) stalls only its own component; and a Connection is a value (copied, holding
// functions) with no identity that components could share a connection by. To publish from
// a process where a Router runs without another connection, use Router.Publisher.
type Connection struct {
	// URL of the broker, e.g. amqp://guest:guest@127.0.0.1:5672/ (amqps:// for TLS), or the
	// URLs of a cluster's nodes separated by commas (a password may hold commas: a new URL
	// starts only where "amqp://" or "amqps://" follows the comma). Required. No error or
	// log line shows its passwords.
	URL string
	// TLS configures the amqps:// connections. Default: the system's roots, and the host of
	// the URL as the server name.
	TLS *tls.Config
	// AMQP is passed to amqp091-go: Vhost (overrides the URLs'), Heartbeat (default 10s),
	// Locale, ChannelMax, SASL, and Properties, whose "connection_name", when set, is put in
	// front of the name warren gives each connection ("warren dlx publisher", ...). warren
	// sets Dial and FrameSize itself; use TLS rather than TLSClientConfig.
	AMQP amqp.Config
	// ConnectTimeout bounds connecting (all nodes, retries included) and declaring. Default 30s.
	// Each node of URL gets a share of it: give each at least 3s, RabbitMQ's pause before it
	// refuses a login, or a wrong password is cut short and retried as a node that does not
	// answer.
	ConnectTimeout time.Duration
	// OnEvent, when set, is told when a connection of any warren component is made, lost,
	// or made again to another node (see ConnectionEvent), so that an application can
	// alert. It is called from warren's goroutines and must not block. The same events are
	// logged.
	OnEvent func(ConnectionEvent)
}

// DefaultConnectTimeout is Connection.ConnectTimeout's default.
const DefaultConnectTimeout = 30 * time.Second

// WithDefaults returns c with every unset field set to its default.
func (c Connection) WithDefaults() Connection {
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	return c
}

// Validate reports the first field of c that is not usable, as "Connection.<field> ...";
// callers put their config's name in front. No error contains a password of URL.
func (c Connection) Validate() error {
	switch {
	case c.URL == "":
		return errors.New("Connection.URL is empty")
	case c.ConnectTimeout < 0:
		return fmt.Errorf("Connection.ConnectTimeout %s is negative", c.ConnectTimeout)
	case c.AMQP.Dial != nil:
		return errors.New("Connection.AMQP.Dial is set: warren dials itself (it guards and batches the socket)")
	case c.AMQP.FrameSize != 0:
		return errors.New("Connection.AMQP.FrameSize is set: warren sets the frame size itself")
	case c.AMQP.TLSClientConfig != nil:
		return errors.New("Connection.AMQP.TLSClientConfig is set: use Connection.TLS")
	case c.AMQP.Heartbeat < 0:
		return fmt.Errorf("Connection.AMQP.Heartbeat %s is negative", c.AMQP.Heartbeat)
	}
	if err := amqpurl.Check(c.URL); err != nil {
		return fmt.Errorf("Connection.URL: %w", err)
	}
	return nil
}

// ConnectionState is what happened to a connection.
type ConnectionState string

// The states a ConnectionEvent reports.
const (
	// Connected: a connection was opened, the first of its kind or again to the same node.
	Connected ConnectionState = "connected"
	// Reconnecting: a connection was lost (Err says why); warren opens it again, on any
	// node, when it is next needed: a subscriber, a ledger.Ledger and a scheduler.Scheduler
	// at once (after a backoff), a publisher at its next publish.
	Reconnecting ConnectionState = "reconnecting"
	// FailedOver: a connection was opened again, to another node than the last one.
	FailedOver ConnectionState = "failed over"
)

// ConnectionEvent tells Connection.OnEvent about one connection of a warren component.
type ConnectionEvent struct {
	State ConnectionState
	// Name of the connection, as the broker's connection list shows it: a Router's "warren
	// subscriber", "warren publisher" and "warren subscriber (isolated)", "warren dlx
	// publisher", "warren subscriber <handler>" (a Subscriber of its own), "warren killer",
	// "warren rpc client", "warren ops", "warren topology", "warren ledger", "warren
	// scheduler <name>" (the group's lock).
	Name string
	// Node is the address (host:port) connected to, or the one lost.
	Node string
	// Previous is the node connected to before, when State is FailedOver.
	Previous string
	// Err is why the connection was lost, when State is Reconnecting.
	Err error
}
