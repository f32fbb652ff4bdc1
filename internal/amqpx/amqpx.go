// Package amqpx is warren's shared plumbing for talking to RabbitMQ: every call to the broker
// goes through Retry (cenkalti/backoff/v4 with a time limit), connections are opened by Dial
// (or a Dialer, which reports them), and channel operations that have no context of their own
// are bounded by Do.
package amqpx

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpurl"
)

// GiveUp marks err as not worth retrying: Retry returns it at once, unwrapped. It is about one
// broker call; warren.Permanent, about one message (its handler is not run again), is another thing.
func GiveUp(err error) error {
	if err == nil {
		return nil
	}
	return backoff.Permanent(err)
}

// Retry runs op until it succeeds, returns an error marked by GiveUp, ctx ends or limit has elapsed,
// and keeps that limit exactly: every attempt gets a context that ends at the deadline,
// transient failures are retried with exponential backoff (each wait clamped to the time
// left), and Retry returns at the deadline, not before, with an error that says what was
// attempted, the limit, and wraps the last failure (and, when the deadline cut that one
// short, the last failure before it, which says why). If ctx ends first, Retry returns at once
// with an error that wraps ctx's cause and says what the last failure was. An empty what
// leaves the errors without it.
func Retry(ctx context.Context, limit time.Duration, what string, op func(ctx context.Context) error) error {
	return RetryLogged(ctx, limit, what, nil, nil, op)
}

// RetryLogged is Retry, telling logger what users need to know (nothing when logger is nil):
// the first transient failure (Info: retrying, until when), the success after failures
// (Info: after how many attempts and how long) and the give-up (Error). Later failures are
// logged at Debug. The log lines name subject() when subject is not nil, else what.
func RetryLogged(ctx context.Context, limit time.Duration, what string, logger watermill.LoggerAdapter,
	subject func() string, op func(ctx context.Context) error) error {
	if limit <= 0 {
		return prefixed(what, fmt.Errorf("time limit %s is not positive", limit))
	}
	if ctx.Err() != nil {
		return prefixed(what, context.Cause(ctx))
	}
	deadline := time.Now().Add(limit)
	// Every attempt ends at the deadline: a context of its own, unless ctx ends by then anyway
	// (an rpc call's, whose limit is its context's).
	attemptCtx, cancel := ctx, context.CancelFunc(func() {})
	if d, ok := ctx.Deadline(); !ok || d.After(deadline) {
		attemptCtx, cancel = context.WithDeadline(ctx, deadline)
	}
	defer cancel()

	var b *backoff.ExponentialBackOff // made at the first failure: most calls succeed at once
	var log *retryLog
	var cause error // the last failure that the deadline did not cut short
	for {
		err := op(attemptCtx)
		if err == nil {
			log.succeeded()
			return nil
		}
		var perm *backoff.PermanentError
		if errors.As(err, &perm) {
			return prefixed(what, perm.Err)
		}
		if !cutShort(err) {
			cause = err
		}
		if log == nil && logger != nil {
			log = &retryLog{logger: logger, what: what, subject: subject, start: time.Now()}
		}
		log.failed(err, deadline)
		if b == nil {
			b = backoff.NewExponentialBackOff()
			b.InitialInterval = 50 * time.Millisecond
			b.MaxInterval = 2 * time.Second
			b.MaxElapsedTime = 0 // the deadline is ours to keep
			b.Reset()
		}
		wait := min(b.NextBackOff(), time.Until(deadline))
		if wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-attemptCtx.Done():
				timer.Stop()
			}
		}
		if ctx.Err() != nil { // the caller's, not the limit
			return prefixed(what, fmt.Errorf("%w (last failure: %w)", context.Cause(ctx), err))
		}
		if !time.Now().Before(deadline) {
			if cause != nil && cutShort(err) { // say why it failed before
				err = fmt.Errorf("%w (before that: %w)", err, cause)
			}
			err = prefixed(what, fmt.Errorf("gave up after %s: %w", limit, err))
			log.gaveUp(err)
			return err
		}
	}
}

// cutShort reports whether err is the deadline's doing: a context's, or a socket's that
// net.Dialer set from it (whichever comes first, a connect that the deadline cuts short
// fails with either).
func cutShort(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
}

// retryLog tells a logger about one RetryLogged call; a nil *retryLog says nothing.
type retryLog struct {
	logger   watermill.LoggerAdapter
	what     string
	subject  func() string
	start    time.Time
	attempts int
}

func (l *retryLog) fields() watermill.LogFields {
	name := l.what
	if l.subject != nil {
		name = l.subject()
	}
	return watermill.LogFields{"call": name, "attempts": l.attempts}
}

func (l *retryLog) failed(err error, deadline time.Time) {
	if l == nil {
		return
	}
	l.attempts++
	f := l.fields().Add(watermill.LogFields{"err": err.Error(), "until": deadline.Format(time.RFC3339Nano)})
	if l.attempts == 1 {
		l.logger.Info("Broker call failed, retrying", f)
	} else {
		l.logger.Debug("Broker call failed again, retrying", f)
	}
}

func (l *retryLog) succeeded() {
	if l == nil {
		return
	}
	l.attempts++
	l.logger.Info("Broker call succeeded after retrying", l.fields().Add(watermill.LogFields{"after": time.Since(l.start).String()}))
}

func (l *retryLog) gaveUp(err error) {
	if l == nil {
		return
	}
	l.logger.Error("Broker call gave up", err, l.fields())
}

// prefixed returns err with what in front, or err itself when what is empty (a caller that
// formats what only when there is an error).
func prefixed(what string, err error) error {
	if what == "" {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

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
// without the password) and never contains a password; a c.URL that does not parse is a
// Permanent error. A handshake that the time limit cut short before the broker sent a single
// byte ends with NoAnswerHint, the likely causes and how to check them.
//
// A refusal that trying again cannot change is an error marked by GiveUp too, wrapping the reason (an
// *amqp.Error, amqp.ErrCredentials, a *tls.CertificateVerificationError, ...): the broker
// refuses the user or password (403; RabbitMQ closes the connection without a word after the
// login, which amqp091-go reports as amqp.ErrCredentials), the vhost (530 NOT_ALLOWED: not
// found, or no permission; a connection limit reached is not permanent), or the SASL
// mechanism; or the node's TLS certificate fails verification (unknown authority, another
// host name, expired). Of a list, a refusal by the broker ends the attempt at once: users,
// passwords, permissions and vhosts belong to the cluster, and every node answers the same.
// A certificate belongs to one node: the other nodes are still tried, and the error is
// Permanent only when every node refused.
//
// The connection is guarded (see GuardConn): no message can make the client library close
// it; and its writes are gathered (see BatchConn).
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

// refusal says whether a failed connection attempt is worth repeating.
type refusal int

const (
	transient     refusal = iota // another attempt may succeed
	nodeRefused                  // this node refuses for good; another node may not
	brokerRefused                // the broker refuses for good, on every node of the cluster
)

// refusalOf classifies err, the failure of one node's connection attempt (see Dial).
func refusalOf(err error, silentCloseRefuses bool) refusal {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	// crypto/tls wraps its own verification's failure; a Connection.TLS verifier of its own
	// (VerifyPeerCertificate, VerifyConnection) may return x509's errors unwrapped.
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		return nodeRefused
	}
	var ae *amqp.Error
	switch {
	case !errors.As(err, &ae):
		return transient
	case ae == amqp.ErrCredentials:
		if silentCloseRefuses {
			return brokerRefused
		}
		return transient
	case ae == amqp.ErrSASL: // the mechanisms the broker offered (connection.start)
		return brokerRefused
	case !ae.Server: // amqp091-go's guess (amqp.ErrVhost): the socket closed during the handshake
		return transient
	case ae.Code == amqp.AccessRefused:
		return brokerRefused
	case ae.Code == amqp.NotAllowed:
		// RabbitMQ's 530s on connection.open: "vhost v not found", "access to vhost 'v'
		// refused for user 'u'" (permanent); a connection limit reached, or an auth
		// backend that "returned an error" (transient).
		if strings.Contains(ae.Reason, "limit") || strings.Contains(ae.Reason, "returned an error") {
			return transient
		}
		return brokerRefused
	}
	return transient
}

// named returns err, the failure of dialling url, with url in front (without its password),
// and saying so when it is a refusal.
func named(url string, err error, r refusal) error {
	if r != transient {
		return fmt.Errorf("%s: %w (refused: not retried)", amqpurl.Redact(url), err)
	}
	return fmt.Errorf("%s: %w", amqpurl.Redact(url), err)
}

// giveUpIf returns err, marked by GiveUp when r is a refusal.
func giveUpIf(r refusal, err error) error {
	if r == transient {
		return err
	}
	return GiveUp(err)
}

// dialOne is Dial for one URL; ctx has a deadline.
func dialOne(ctx context.Context, c warren.Connection, url, name string) (*amqp.Connection, string, error) {
	deadline, _ := ctx.Deadline()
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return nil, "", GiveUp(amqpurl.RedactError(url, err))
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
	var tlsConfig *tls.Config
	if uri.Scheme == "amqps" {
		// amqp091 would put TLS around the guarded socket; warren puts it underneath.
		tlsConfig = &tls.Config{}
		if c.TLS != nil {
			tlsConfig = c.TLS.Clone()
		}
		if tlsConfig.ServerName == "" {
			tlsConfig.ServerName = cmp.Or(uri.ServerName, uri.Host)
		}
		u, err := neturl.Parse(url) // checked: it parses
		if err != nil {
			return nil, "", GiveUp(amqpurl.RedactError(url, err))
		}
		u.Scheme, u.Host = "amqp", net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
		url = u.String()
	}
	var (
		addr string
		stop func() bool // stops cutting the handshake short when ctx ends
		sock net.Conn    // what amqp091 was given
		read *readConn   // the socket: tells whether the broker sent anything (TLS included)
	)
	cfg.Dial = func(network, address string) (net.Conn, error) {
		addr = address
		raw, err := (&net.Dialer{}).DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		read = &readConn{Conn: raw}
		var c net.Conn = read
		// amqp091 clears the deadline once the handshake is complete.
		if err := c.SetDeadline(deadline); err != nil {
			_ = c.Close()
			return nil, err
		}
		stop = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
		if tlsConfig != nil {
			tc := tls.Client(c, tlsConfig)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = c.Close()
				return nil, fmt.Errorf("TLS handshake with %s: %w", address, err)
			}
			c = tc
		}
		sock = GuardConn(BatchConn(c), FrameSize)
		return sock, nil
	}
	conn, err := amqp.DialConfig(url, cfg)
	if err != nil && sock != nil {
		_ = sock.Close() // amqp091 does not always close it when the handshake fails
	}
	if stop != nil { // connected: did ctx end during (or just after) the handshake?
		cut := !stop()
		if cut && err == nil {
			_ = conn.Close()
		}
		if cut || err != nil && !time.Now().Before(deadline) {
			cause := context.Cause(ctx)
			if cause == nil { // the connection's deadline came first
				cause = context.DeadlineExceeded
			}
			err = fmt.Errorf("AMQP handshake with %s: %w", addr, cause)
			if errors.Is(cause, context.DeadlineExceeded) && !read.answered.Load() {
				err = fmt.Errorf("%w: %s", err, NoAnswerHint)
			}
		}
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		// The broker's reply, or amqp091's own words for a handshake cut short: never the
		// URL. RedactError would hide a reason that shares a few letters with the password
		// ("username or password not allowed"), and errors.Is and As with it.
		return nil, "", err
	}
	if err != nil {
		return nil, "", amqpurl.RedactError(url, err)
	}
	return conn, addr, nil
}

// CloseTimeout bounds Close.
const CloseTimeout = 5 * time.Second

// Close closes conn, waiting for the broker's answer no longer than CloseTimeout (a broker
// that no longer answers would hold amqp091's Close until the heartbeats time out).
func Close(conn *amqp.Connection) error {
	if conn == nil || conn.IsClosed() {
		return nil
	}
	return conn.CloseDeadline(time.Now().Add(CloseTimeout))
}

// watchGrace is how long Watch lets a call that ctx ended return by itself.
const watchGrace = 100 * time.Millisecond

// Watch makes the calls on conn until stop keep ctx's limit: amqp091's channel calls
// (opening and closing a channel, declaring, Do's closing of the channel) have no deadline
// of their own and block while the broker does not answer. If ctx ends and stop has not
// been called 100ms later, the broker is taken for gone and conn is closed, which ends every
// call blocked on it. stop must be called once.
func Watch(ctx context.Context, conn *amqp.Connection) (stop func()) {
	done := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		select {
		case <-done:
		case <-time.After(watchGrace):
			_ = conn.CloseDeadline(time.Now())
		}
	})
	return func() {
		close(done)
		stopWatch()
	}
}

// Do runs op, which makes one call on ch that waits for the broker, and returns its error.
// If ctx ends first and op has not returned a moment later (watchGrace), ch is closed (which
// makes op return) and the context's error is returned: a broker that does not answer can
// never hang the caller. One call only: amqp091-go hands the channel's close-ok to whichever
// call waits, so a second call sent after the close could take it and leave Close waiting
// for ever.
func Do(ctx context.Context, ch *amqp.Channel, op func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-done:
		return err
	case <-time.After(watchGrace):
		_ = ch.Close()
		opErr := <-done
		_ = opErr // it failed because of the close: ctx's error says why
		return ctx.Err()
	}
}

// GiveUpIfRefused marks err by GiveUp when it is a broker refusal that retrying cannot
// change (see IsPermanentBrokerError), and returns it unchanged otherwise.
func GiveUpIfRefused(err error) error {
	if IsPermanentBrokerError(err) {
		return GiveUp(err)
	}
	return err
}

// IsPermanentBrokerError reports whether err is a broker reply that retrying cannot change
// (access refused, precondition failed, not found, ...), as opposed to a lost connection.
// A durable queue reported absent ("home node ... is down or inaccessible") is not
// permanent: in a cluster its node may come back, and on a single node RabbitMQ (3.x)
// gives that reply for a moment while another connection declares or deletes the same
// queue (it reads its two queue tables outside a transaction). Seen in CI when parallel
// publishers declared the same delay levels at once.
func IsPermanentBrokerError(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	if ae.Code == amqp.NotFound && strings.Contains(ae.Reason, "is down or inaccessible") {
		return false
	}
	switch ae.Code {
	case amqp.AccessRefused, amqp.PreconditionFailed, amqp.NotFound, amqp.ResourceLocked,
		amqp.NotAllowed, amqp.NotImplemented, amqp.SyntaxError, amqp.CommandInvalid, amqp.InvalidPath:
		return true
	}
	return false
}

// IsNotFound reports whether err is the broker's answer that a queue or exchange does not
// exist (404 NOT_FOUND), and not the one about a durable queue whose node is down (see
// IsPermanentBrokerError).
func IsNotFound(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.NotFound && IsPermanentBrokerError(err)
}
