package amqpx_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
)

// A Dialer reports its connection: connected, lost (reconnecting), and connected again to
// another node (failed over), with the nodes and the reason.
func TestDialerReportsConnectedLostAndFailedOver(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	a, urlA := testenv.ProxyURL(t, env.URL)
	b, urlB := testenv.ProxyURL(t, env.URL)
	events := make(chan warren.ConnectionEvent, 10)
	d := amqpx.NewDialer(warren.Connection{URL: urlA + "," + urlB, OnEvent: func(e warren.ConnectionEvent) { events <- e }},
		"warren test", nil)
	next := func() warren.ConnectionEvent {
		t.Helper()
		select {
		case e := <-events:
			return e
		case <-time.After(testenv.Patience()):
			t.Fatal("no connection event")
			return warren.ConnectionEvent{}
		}
	}

	first, err := d.Dial(t.Context())
	require.NoError(t, err)
	defer first.Close()
	e := next()
	assert.Equal(t, warren.Connected, e.State)
	assert.Equal(t, "warren test", e.Name)
	require.Contains(t, []string{a.Addr(), b.Addr()}, e.Node)
	node, other := a, b
	if e.Node == b.Addr() {
		node, other = b, a
	}

	node.Close() // the node goes: its connections drop, it refuses new ones
	e = next()
	assert.Equal(t, warren.Reconnecting, e.State)
	assert.Equal(t, node.Addr(), e.Node)
	assert.Error(t, e.Err)

	second, err := d.Dial(t.Context())
	require.NoError(t, err)
	e = next()
	assert.Equal(t, warren.FailedOver, e.State)
	assert.Equal(t, other.Addr(), e.Node)
	assert.Equal(t, node.Addr(), e.Previous)
	require.NoError(t, second.Close()) // closed by its owner: no event
	third, err := d.Dial(t.Context())
	require.NoError(t, err)
	require.NoError(t, third.Close())
	e = next()
	assert.Equal(t, warren.Connected, e.State, "the same node again: %+v", e)
	assert.Empty(t, events, "closing a connection is no event")
}

// Connection.AMQP reaches amqp091-go: heartbeat, vhost, and a connection name that is put
// in front of warren's.
func TestDialPassesTheAMQPConfig(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	conn, _, err := amqpx.Dial(t.Context(), warren.Connection{URL: env.URL, AMQP: amqp.Config{
		Heartbeat:  3 * time.Second,
		Properties: amqp.Table{"connection_name": "billing"},
	}}, "warren test")
	require.NoError(t, err)
	defer conn.Close()
	assert.Equal(t, 3*time.Second, conn.Config.Heartbeat)
	assert.Equal(t, "billing warren test", conn.Config.Properties["connection_name"])

	_, _, err = amqpx.Dial(t.Context(), warren.Connection{URL: env.URL, AMQP: amqp.Config{Vhost: "warren-no-such-vhost"}}, "warren test")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "vhost")
}

// An amqps:// URL is dialled with TLS underneath warren's guard (amqp091 would put it on
// top, where the guard would read encrypted bytes): messages go both ways, and a server
// that Connection.TLS does not trust is refused.
func TestDialTLS(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	pool, addr := tlsTerminator(t, hostOf(t, env.URL))
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	tlsURL := "amqps://guest:guest@localhost:" + port + "/"

	conn, node, err := amqpx.Dial(t.Context(), warren.Connection{URL: tlsURL, TLS: &tls.Config{RootCAs: pool}}, "warren test")
	require.NoError(t, err)
	defer conn.Close()
	assert.Equal(t, "localhost:"+port, node)
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("over TLS"), Headers: amqp.Table{"k": "v"}}))
	var got amqp.Delivery
	require.Eventually(t, func() bool {
		d, ok, err := ch.Get(q.Name, true)
		require.NoError(t, err)
		got = d
		return ok
	}, testenv.Patience(), 20*time.Millisecond)
	assert.Equal(t, "over TLS", string(got.Body))
	assert.Equal(t, "v", got.Headers["k"])

	_, _, err = amqpx.Dial(t.Context(), warren.Connection{URL: tlsURL}, "warren test")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "certificate")
}

func hostOf(t *testing.T, raw string) string {
	u, err := url.Parse(raw)
	require.NoError(t, err)
	return u.Host
}

// tlsTerminator listens with TLS (a certificate for localhost, made up here) and forwards
// the plain bytes to target, until t ends. It returns the pool that trusts its certificate,
// and its address.
func tlsTerminator(t *testing.T, target string) (*x509.CertPool, string) {
	pool, addr, _ := tlsTerminatorWith(t, target, nil)
	return pool, addr
}

// tlsTerminatorWith is tlsTerminator with a certificate that edit, when not nil, changes
// first; accepted says how many connections it has accepted.
func tlsTerminatorWith(t *testing.T, target string, edit func(*x509.Certificate)) (pool *x509.CertPool, addr string, accepted func() int) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if edit != nil {
		edit(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	var n int
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			n++
			mu.Unlock()
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			open = append(open, c, up)
			mu.Unlock()
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				_ = dst.Close()
				_ = src.Close()
			}
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	return pool, l.Addr().String(), func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}
