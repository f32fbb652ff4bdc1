package amqpx

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	neturl "net/url"
	"strconv"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpurl"
)

// NoAnswerHint ends the error of a dial whose TCP connection the broker accepted and whose
// AMQP handshake it never answered, not one byte, before the time limit: a broker that cannot
// even send connection.start. It names the likely causes and how to check each.
const NoAnswerHint = "the broker accepted the TCP connection and sent nothing back. Likely causes: " +
	"a RabbitMQ 3.x node out of file handles, 3 per quorum queue (`rabbitmqctl eval 'file_handle_cache:info().'`: " +
	"total_used at total_limit; `rabbitmqctl status` and fd_total of the management API's /api/nodes give the " +
	"open-file limit, but its fd_used does not count these handles; `warren status --management URL` estimates them), " +
	"a resource alarm (`rabbitmqctl status`), or an overloaded node; see warren's docs/operating.md"

// readConn is a net.Conn that records whether anything was read from it.
type readConn struct {
	net.Conn
	answered atomic.Bool
}

func (c *readConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.answered.Load() {
		c.answered.Store(true)
	}
	return n, err
}

// FrameSize is the frame size warren's connections ask for (RabbitMQ's default frame_max).
const FrameSize = 131072

// DialTimeout bounds Dial when its context has no earlier deadline.
const DialTimeout = 30 * time.Second

// Dial opens a connection as c says: to one of the nodes of c.URL, tried in a random order
// until one answers, each with an equal share of the time left. The TCP connect and the AMQP
// handshake (TLS included) are bounded together by ctx's deadline or DialTimeout, whichever
// is earlier, and end at once when ctx is cancelled; name is shown in the broker's connection
// list. It returns the address of the node connected to. An error names the node (its URL
// without the password) and never contains a password; a c.URL that does not parse is marked
// by GiveUp. A handshake that the time limit cut short before the broker sent a single byte
// ends with NoAnswerHint, the likely causes and how to check them.
//
// A refusal that trying again cannot change is marked by GiveUp too, wrapping the reason (an
// *amqp.Error, amqp.ErrCredentials, a *tls.CertificateVerificationError, ...): the broker
// refuses the user or password (403; RabbitMQ closes the connection without a word after the
// login, which amqp091-go reports as amqp.ErrCredentials), the vhost (530 NOT_ALLOWED: not
// found, or no permission; a connection limit reached is not permanent), or the SASL
// mechanism; or the node's TLS certificate fails verification (unknown authority, another
// host name, expired). Of a list, a refusal by the broker ends the attempt at once: users,
// passwords, permissions and vhosts belong to the cluster, and every node answers the same.
// A certificate belongs to one node: the other nodes are still tried, and the error is
// marked by GiveUp only when every node refused.
//
// The connection is guarded (see GuardConn): no message can make the client library close
// it; and its writes are gathered (see BatchConn).
//
// Dial reports nothing: warren's components dial through a Dialer, whose Dial is Dial and
// reports the connection (Connection.OnEvent, the logger). Dial alone is for a connection
// nobody is told about, a test's.
func Dial(ctx context.Context, c warren.Connection, name string) (conn *amqp.Connection, node string, err error) {
	return dial(ctx, c, name, true)
}

// dial is Dial. silentCloseRefuses says whether a connection closed without a word after the
// login (amqp.ErrCredentials) is taken for RabbitMQ's refusal of the user or password, as it
// is until these credentials have worked: a node that stops during the handshake closes it
// the same way, and a Dialer that has connected before retries it (see Dialer.Dial).
func dial(ctx context.Context, c warren.Connection, name string, silentCloseRefuses bool) (conn *amqp.Connection, node string, err error) {
	if err := amqpurl.Check(c.URL); err != nil {
		return nil, "", GiveUp(err)
	}
	ctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	urls := amqpurl.Split(c.URL)
	if len(urls) == 1 {
		conn, node, err := dialOne(ctx, c, urls[0], name)
		if err != nil {
			r := refusalOf(err, silentCloseRefuses)
			return nil, "", giveUpIf(r, named(urls[0], err, r))
		}
		return conn, node, nil
	}
	deadline, _ := ctx.Deadline()
	var errs []error
	everyNodeRefused := true
	for i, n := range rand.Perm(len(urls)) {
		share := time.Until(deadline) / time.Duration(len(urls)-i)
		attempt, cancelAttempt := context.WithTimeout(ctx, share)
		conn, node, err := dialOne(attempt, c, urls[n], name)
		cancelAttempt()
		if err == nil {
			return conn, node, nil
		}
		r := refusalOf(err, silentCloseRefuses)
		if r == brokerRefused {
			return nil, "", GiveUp(named(urls[n], err, r))
		}
		errs = append(errs, named(urls[n], err, r))
		everyNodeRefused = everyNodeRefused && r == nodeRefused
		if ctx.Err() != nil {
			break
		}
	}
	err = fmt.Errorf("no node of %d answered: %w", len(urls), errors.Join(errs...))
	if everyNodeRefused && len(errs) == len(urls) {
		return nil, "", GiveUp(err)
	}
	return nil, "", err
}

// dialOne is Dial for one URL; ctx has a deadline.
func dialOne(ctx context.Context, c warren.Connection, url, name string) (*amqp.Connection, string, error) {
	deadline, _ := ctx.Deadline()
	cfg, url, tlsConfig, err := handshakeConfig(c, url, name)
	if err != nil {
		return nil, "", err
	}
	var s socket
	cfg.Dial = s.dialer(ctx, deadline, tlsConfig)
	conn, err := amqp.DialConfig(url, cfg)
	if err != nil && s.sock != nil {
		_ = s.sock.Close() // amqp091 does not always close it when the handshake fails
	}
	if conn, err = s.settle(ctx, deadline, conn, err); err != nil {
		return nil, "", redactDialError(url, err)
	}
	return conn, s.addr, nil
}

// handshakeConfig returns amqp091's configuration of a connection to url as c says, named
// name (after c's connection_name, when it has one), and the URL to hand amqp091: an amqps
// URL becomes amqp, and the TLS configuration is returned for the socket underneath (nil for
// amqp). A URL that does not parse is marked by GiveUp.
func handshakeConfig(c warren.Connection, url, name string) (amqp.Config, string, *tls.Config, error) {
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return amqp.Config{}, "", nil, GiveUp(amqpurl.RedactError(url, err))
	}
	cfg := c.AMQP
	cfg.Properties = amqp.Table{}
	for k, v := range c.AMQP.Properties {
		cfg.Properties[k] = v
	}
	if prefix, ok := cfg.Properties["connection_name"].(string); ok && prefix != "" {
		name = prefix + " " + name
	}
	cfg.Properties.SetClientConnectionName(name)
	if cfg.Locale == "" {
		cfg.Locale = "en_US"
	}
	cfg.FrameSize = FrameSize
	if uri.Scheme != "amqps" {
		return cfg, url, nil, nil
	}
	// amqp091 would put TLS around the guarded socket; warren puts it underneath.
	tlsConfig := &tls.Config{}
	if c.TLS != nil {
		tlsConfig = c.TLS.Clone()
	}
	if tlsConfig.ServerName == "" {
		tlsConfig.ServerName = cmp.Or(uri.ServerName, uri.Host)
	}
	u, err := neturl.Parse(url) // checked: it parses
	if err != nil {
		return amqp.Config{}, "", nil, GiveUp(amqpurl.RedactError(url, err))
	}
	u.Scheme, u.Host = "amqp", net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	return cfg, u.String(), tlsConfig, nil
}

// socket is what dialOne's dial function made of the one connection amqp091 asks it for.
type socket struct {
	addr string
	stop func() bool // stops cutting the handshake short when ctx ends
	sock net.Conn    // what amqp091 was given
	read *readConn   // the socket: tells whether the broker sent anything (TLS included)
}

// dialer returns amqp091's dial function: a TCP connection (TLS on it when tlsConfig is not
// nil) whose handshake ends at deadline, or at once when ctx ends, guarded and gathering its
// writes.
func (s *socket) dialer(ctx context.Context, deadline time.Time, tlsConfig *tls.Config) func(network, address string) (net.Conn, error) {
	return func(network, address string) (net.Conn, error) {
		s.addr = address
		var raw net.Conn
		var err error
		if dial, ok := inProcessDial(address); ok {
			raw, err = dial()
		} else {
			raw, err = (&net.Dialer{}).DialContext(ctx, network, address)
		}
		if err != nil {
			return nil, err
		}
		s.read = &readConn{Conn: raw}
		var c net.Conn = s.read
		// amqp091 clears the deadline once the handshake is complete.
		if err := c.SetDeadline(deadline); err != nil {
			_ = c.Close()
			return nil, err
		}
		s.stop = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
		if tlsConfig != nil {
			tc := tls.Client(c, tlsConfig)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = c.Close()
				return nil, fmt.Errorf("TLS handshake with %s: %w", address, err)
			}
			c = tc
		}
		s.sock = GuardConn(BatchConn(c), FrameSize)
		return s.sock, nil
	}
}

// settle returns what amqp091's handshake gave (conn, err), unless ctx ended during (or just
// after) it or the deadline cut it short: then the connection is closed and the error says
// the handshake was cut short, and why, with NoAnswerHint when the broker never sent a byte.
func (s *socket) settle(ctx context.Context, deadline time.Time, conn *amqp.Connection, err error) (*amqp.Connection, error) {
	if s.stop == nil { // no socket was connected
		return conn, err
	}
	short := !s.stop()
	if short && err == nil {
		_ = conn.Close()
	}
	if !short && (err == nil || time.Now().Before(deadline)) {
		return conn, err
	}
	cause := context.Cause(ctx)
	if cause == nil { // the connection's deadline came first
		cause = context.DeadlineExceeded
	}
	err = fmt.Errorf("AMQP handshake with %s: %w", s.addr, cause)
	if errors.Is(cause, context.DeadlineExceeded) && !s.read.answered.Load() {
		err = fmt.Errorf("%w: %s", err, NoAnswerHint)
	}
	return nil, err
}

// redactDialError returns err, the failure of dialling url, without url's password. The
// broker's reply, or amqp091's own words for a handshake cut short (an *amqp.Error), is
// returned as it is: it never holds the URL, and RedactError would hide a reason that shares
// a few letters with the password ("username or password not allowed"), and errors.Is and As
// with it.
func redactDialError(url string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return err
	}
	return amqpurl.RedactError(url, err)
}
