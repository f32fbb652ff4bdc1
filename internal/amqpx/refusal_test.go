package amqpx_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpurl"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
)

// node is an address to dial and a count of the connections it accepted.
type node struct {
	url   string
	tls   *tls.Config
	dials func() int
}

// proxiedNode is the broker of raw, through a proxy that counts connections; edit changes
// the URL (user, password, vhost) first.
func proxiedNode(t *testing.T, raw string, edit func(*url.URL)) node {
	u, err := url.Parse(raw)
	require.NoError(t, err)
	edit(u)
	p, proxied := testenv.ProxyURL(t, u.String())
	return node{url: proxied, dials: p.Accepted}
}

// tlsNode is the broker of raw behind TLS, dialled as host with tls; edit changes the
// certificate (see tlsTerminatorWith); trusted says whether the client trusts it.
func tlsNode(t *testing.T, raw, host string, edit func(*x509.Certificate), trusted bool) node {
	pool, addr, accepted := tlsTerminatorWith(t, hostOf(t, raw), edit)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	cfg := &tls.Config{}
	if trusted {
		cfg.RootCAs = pool
	}
	return node{url: "amqps://guest:guest@" + net.JoinHostPort(host, port) + "/", tls: cfg, dials: accepted}
}

func wrongPassword(u *url.URL) { u.User = url.UserPassword(u.User.Username(), "not-the-password") }
func unknownVhost(u *url.URL)  { u.Path = "/warren-no-such-vhost" }

func expired(c *x509.Certificate) {
	c.NotBefore, c.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
}

// isPermanent reports whether err is marked Permanent (Retry would not try again).
func isPermanent(err error) bool {
	var perm *backoff.PermanentError
	return errors.As(err, &perm)
}

// connect connects with d and closes the connection, retrying for up to limit.
func connect(t *testing.T, d *amqpx.Dialer, limit time.Duration) error {
	return d.Run(t.Context(), limit, "connect", func(context.Context, *amqp.Connection) error { return nil })
}

// What retrying cannot change fails the first attempt, with the reason (reachable with
// errors.Is and As) and the node (without its password): a wrong password, an unknown vhost,
// a certificate that fails verification.
func TestConnectDoesNotRetryARefusal(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	for _, tc := range []struct {
		name  string
		node  node
		cause func(t *testing.T, err error)
	}{
		{"wrong password", proxiedNode(t, env.URL, wrongPassword), func(t *testing.T, err error) {
			require.ErrorIs(t, err, amqp.ErrCredentials)
		}},
		{"unknown vhost", proxiedNode(t, env.URL, unknownVhost), func(t *testing.T, err error) {
			var ae *amqp.Error
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, amqp.NotAllowed, ae.Code)
			assert.Contains(t, ae.Reason, "vhost warren-no-such-vhost not found")
		}},
		{"unknown authority", tlsNode(t, env.URL, "localhost", nil, false), func(t *testing.T, err error) {
			var verify *tls.CertificateVerificationError
			require.ErrorAs(t, err, &verify)
			require.ErrorAs(t, err, new(x509.UnknownAuthorityError))
		}},
		{"another host name", tlsNode(t, env.URL, "127.0.0.1", nil, true), func(t *testing.T, err error) {
			require.ErrorAs(t, err, new(x509.HostnameError))
		}},
		{"expired certificate", tlsNode(t, env.URL, "localhost", expired, true), func(t *testing.T, err error) {
			var invalid x509.CertificateInvalidError
			require.ErrorAs(t, err, &invalid)
			assert.Equal(t, x509.Expired, invalid.Reason)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			logger := watermill.NewCaptureLogger()
			d := amqpx.NewDialer(warren.Connection{URL: tc.node.url, TLS: tc.node.tls, ConnectTimeout: time.Minute}, "warren test", logger)
			err := connect(t, d, time.Minute)
			require.Error(t, err)
			tc.cause(t, err)
			assert.Contains(t, err.Error(), amqpurl.Redact(tc.node.url)+": ")
			assert.Contains(t, err.Error(), "refused: not retried")
			assert.Equal(t, 1, tc.node.dials(), "dialled once: %v", err)
			assert.Empty(t, logger.Captured()[watermill.InfoLogLevel], "no retry")
		})
	}
}

// Of a cluster's nodes, the broker's refusal of a login or vhost ends the attempt at once
// (users and vhosts are the cluster's: every node answers the same); a certificate is one
// node's: the other nodes are still tried, and only when each refuses is it final.
func TestConnectToAListOnARefusal(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	connectTo := func(t *testing.T, timeout time.Duration, nodes ...node) error {
		t.Helper()
		var urls []string
		var cfg *tls.Config
		for _, n := range nodes {
			urls = append(urls, n.url)
			if n.tls != nil {
				cfg = n.tls
			}
		}
		list := urls[0]
		for _, u := range urls[1:] {
			list += "," + u
		}
		return connect(t, amqpx.NewDialer(warren.Connection{URL: list, TLS: cfg, ConnectTimeout: timeout}, "warren test", nil), timeout)
	}

	t.Run("wrong password", func(t *testing.T) {
		t.Parallel()
		a, b := proxiedNode(t, env.URL, wrongPassword), proxiedNode(t, env.URL, wrongPassword)
		err := connectTo(t, time.Minute, a, b)
		require.ErrorIs(t, err, amqp.ErrCredentials)
		assert.Equal(t, 1, a.dials()+b.dials(), "one node dialled: %v", err)
	})
	t.Run("one node's certificate", func(t *testing.T) {
		t.Parallel()
		bad, good := tlsNode(t, env.URL, "localhost", nil, false), proxiedNode(t, env.URL, func(*url.URL) {})
		for range 4 { // either order
			require.NoError(t, connectTo(t, time.Minute, bad, good))
		}
	})
	t.Run("every node's certificate", func(t *testing.T) {
		t.Parallel()
		a, b := tlsNode(t, env.URL, "localhost", nil, false), tlsNode(t, env.URL, "localhost", expired, true)
		err := connectTo(t, time.Minute, a, b)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "connect: no node of 2 answered") // not "gave up after"
		require.ErrorAs(t, err, new(x509.UnknownAuthorityError))
		require.ErrorAs(t, err, new(x509.CertificateInvalidError))
		assert.Equal(t, []int{1, 1}, []int{a.dials(), b.dials()}, "each node dialled once: %v", err)
	})
	t.Run("a certificate and a node down", func(t *testing.T) {
		t.Parallel()
		bad := tlsNode(t, env.URL, "localhost", nil, false)
		down := node{url: "amqp://guest:guest@" + testenv.ClosedPort(t) + "/"}
		// Time for TLS handshakes on a loaded machine: in make test, one handshake took 3 s.
		err := connectTo(t, 10*time.Second, bad, down)
		require.Error(t, err)
		// The node that is down may come back.
		assert.Contains(t, err.Error(), "gave up after 10s: no node of 2 answered")
		require.ErrorAs(t, err, new(x509.UnknownAuthorityError))
		assert.Contains(t, err.Error(), "connection refused")
		assert.Greater(t, bad.dials(), 1, "retried: %v", err)
	})
}

// cutter forwards connections to a broker and, while cut is set, closes them right after
// the client's login (connection.start-ok) instead: a node that stops during the handshake.
// amqp091-go reports that as amqp.ErrCredentials, as it does RabbitMQ's refusal of a login.
type cutter struct {
	mu  sync.Mutex
	cut bool
}

func (c *cutter) set(cut bool) {
	c.mu.Lock()
	c.cut = cut
	c.mu.Unlock()
}

// listen starts the cutter in front of target until t ends and returns its address.
func (c *cutter) listen(t *testing.T, target string) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			broker, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			c.mu.Lock()
			cut := c.cut
			c.mu.Unlock()
			t.Cleanup(func() { _ = client.Close(); _ = broker.Close() })
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(client, broker)
				_ = client.Close()
			}()
			go func() {
				defer wg.Done()
				defer broker.Close()
				defer client.Close()
				if !cut {
					_, _ = io.Copy(broker, client)
					return
				}
				// The protocol header, then start-ok's frame header: its size, then the
				// rest of it, which is read and not passed on.
				if _, err := io.CopyN(broker, client, 8); err != nil {
					return
				}
				head := make([]byte, 7)
				if _, err := io.ReadFull(client, head); err != nil {
					return
				}
				_, _ = io.ReadFull(client, make([]byte, binary.BigEndian.Uint32(head[3:])+1))
			}()
		}
	}()
	return l.Addr().String()
}

// A Dialer takes a connection closed without a word after the login for RabbitMQ's refusal
// until it has connected with these credentials; from then on, for a node that went down
// during the handshake, which is retried.
func TestDialerRetriesALoginCutOnceItHasConnected(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	c := &cutter{}
	u := testenv.WithHost(t, env.URL, c.listen(t, hostOf(t, env.URL)))
	conn := warren.Connection{URL: u, ConnectTimeout: time.Minute}

	c.set(true)
	_, err := amqpx.NewDialer(conn, "warren test", nil).Dial(t.Context())
	require.ErrorIs(t, err, amqp.ErrCredentials)
	assert.True(t, isPermanent(err), "a Dialer that never connected: a refusal")

	d := amqpx.NewDialer(conn, "warren test", nil)
	c.set(false)
	first, err := d.Dial(t.Context())
	require.NoError(t, err)
	require.NoError(t, first.Close())
	c.set(true)
	_, err = d.Dial(t.Context())
	require.ErrorIs(t, err, amqp.ErrCredentials)
	assert.False(t, isPermanent(err), "a Dialer that has connected: retried")
	assert.NotContains(t, err.Error(), "not retried")
}
