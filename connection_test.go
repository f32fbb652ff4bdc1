package warren_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	neturl "net/url"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/amqpurl"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/rpc"
	"github.com/warrenmq/warren/topology"
)

// untrustedTLS listens with TLS, presenting a certificate for localhost that nobody trusts,
// until t ends; the client's verification fails before any AMQP. It returns its address and
// how many connections it has accepted.
func untrustedTLS(t *testing.T) (addr string, accepted func() int) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	require.NoError(t, err)
	var (
		mu sync.Mutex
		n  int
		wg sync.WaitGroup
	)
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
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
			_ = c.(*tls.Conn).Handshake() // fails: the client refuses the certificate
			_ = c.Close()
		}
	}()
	return l.Addr().String(), func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// Every component that connects fails the first attempt on what retrying cannot change, with
// the reason and the node: a wrong password, an unknown vhost, a certificate nobody trusts.
// Each is given a minute to connect; each dials once.
func TestEveryComponentFailsAtOnceOnARefusal(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	proxied := func(t *testing.T, edit func(*neturl.URL)) (string, func() int) {
		u, err := neturl.Parse(env.URL)
		require.NoError(t, err)
		edit(u)
		p, proxied := testenv.ProxyURL(t, u.String())
		return proxied, p.Accepted
	}
	refusals := []struct {
		name  string
		node  func(t *testing.T) (url string, dials func() int) // a node of the test's own
		cause func(t *testing.T, err error)
	}{
		{"wrong password", func(t *testing.T) (string, func() int) {
			return proxied(t, func(u *neturl.URL) { u.User = neturl.UserPassword(u.User.Username(), "not-the-password") })
		}, func(t *testing.T, err error) {
			require.ErrorIs(t, err, amqp.ErrCredentials)
		}},
		{"unknown vhost", func(t *testing.T) (string, func() int) {
			return proxied(t, func(u *neturl.URL) { u.Path = "/warren-no-such-vhost" })
		}, func(t *testing.T, err error) {
			var ae *amqp.Error
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, amqp.NotAllowed, ae.Code)
		}},
		{"untrusted certificate", func(t *testing.T) (string, func() int) {
			addr, dials := untrustedTLS(t)
			_, port, err := net.SplitHostPort(addr)
			require.NoError(t, err)
			return "amqps://guest:guest@localhost:" + port + "/", dials
		}, func(t *testing.T, err error) {
			var verify *tls.CertificateVerificationError
			require.ErrorAs(t, err, &verify)
		}},
	}

	components := []struct {
		name    string
		connect func(ctx context.Context, conn warren.Connection) error
	}{
		{"dlx publisher", func(_ context.Context, conn warren.Connection) error {
			p, err := dlx.NewPublisher(dlx.Config{Connection: conn, PublishTimeout: time.Minute}, nil)
			if err == nil {
				_ = p.Close()
			}
			return err
		}},
		{"router", func(_ context.Context, conn warren.Connection) error {
			r, err := router.New(router.Config{Connection: conn}, nil)
			if err == nil {
				_ = r.Close()
			}
			return err
		}},
		{"subscriber", func(_ context.Context, conn warren.Connection) error {
			s, err := consumer.NewSubscriber(consumer.Config{Connection: conn}, nil)
			if err != nil {
				return err
			}
			defer s.Close()
			return s.SubscribeInitialize(env.Queue("refused"))
		}},
		{"killer", func(ctx context.Context, conn warren.Connection) error {
			k, err := kill.NewKiller(kill.Config{Connection: conn, PublishTimeout: time.Minute, Force: true}, nil)
			if err != nil {
				return err
			}
			return k.Kill(ctx, env.Queue("refused"), kill.Stop)
		}},
		{"rpc client", func(_ context.Context, conn warren.Connection) error {
			c, err := rpc.NewClient(rpc.ClientConfig{Connection: conn}, nil)
			if err == nil {
				_ = c.Close()
			}
			return err
		}},
		{"ops", func(ctx context.Context, conn warren.Connection) error {
			o, err := ops.New(ops.Config{Connection: conn, Timeout: time.Minute}, nil)
			if err != nil {
				return err
			}
			defer o.Close()
			_, err = o.Status(ctx, env.Queue("refused"))
			return err
		}},
		{"topology builder", func(ctx context.Context, conn warren.Connection) error {
			b, err := topology.NewBuilder(topology.Config{Timeout: time.Minute}, nil)
			if err != nil {
				return err
			}
			return b.Apply(ctx, conn, topology.Topology{})
		}},
	}
	for _, r := range refusals {
		for _, c := range components {
			t.Run(r.name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				url, dials := r.node(t)
				err := c.connect(t.Context(), warren.Connection{URL: url, TLS: &tls.Config{}, ConnectTimeout: time.Minute})
				require.Error(t, err)
				r.cause(t, err)
				assert.Contains(t, err.Error(), amqpurl.Redact(url)+": ")
				assert.Contains(t, err.Error(), "refused: not retried")
				assert.NotContains(t, err.Error(), "not-the-password")
				assert.Equal(t, 1, dials(), "dialled once: %v", err)
			})
		}
	}
}
