package main

import (
	"context"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// The password of every URL below; neither half may show anywhere.
var secretParts = []string{"s3cr3t", "P4ss"}

// urls returns malformed URLs (Go's url.Error quotes the whole URL; amqp091 takes
// "amqp:user:pass@host" for the local broker as guest) and valid ones that reach no
// broker, or the real broker with a wrong password, all carrying the password.
func urls(t *testing.T) (malformed, valid []string) {
	refused, hole := testenv.ClosedPort(t), testenv.BlackHole(t)
	malformed = []string{
		"amqp://guest:s3cr3t-P4ss@host:port/",
		"amqp://guest:s3cr3t-P4ss@host:-1/",
		"amqp://guest:s3cr3t-P4ss@host:5672:5672/",
		"amqp://guest:s3cr3t-P4ss@127.0.0.1:99999999999/",
		"amqp://guest:s3cr3t-P4ss@host:5672/%zz",
		"amqp://guest:s3cr3t-P4ss@host:5672/%",
		"amqp://guest:s3cr3t-P4ss@host:5672/%2",
		"amqp://guest:s3cr3t-P4ss@host:5672/vhost%zz%zz",
		"amqp://guest:s3cr3t-P4ss@ho%zzst/",
		"amqp://gu%zzest:s3cr3t-P4ss@host/",
		"amqp://guest:s3cr3t-P4ss%zz@host/",
		"amqp://guest:s3cr3t-P4ss@[::1:5672/",
		"amqp://guest:s3cr3t-P4ss@[::1]]:5672/",
		"amqp://guest:s3cr3t-P4ss@[::1]:x/",
		"amqp://guest:s3cr3t-P4ss@[fe80::1%zz]:5672/",
		"amqp://guest:s3cr3t-P4ss@ho st/",
		"amqp://guest:s3cr3t-P4ss@host:5672/\x7f",
		"amqp://guest:s3cr3t-P4ss@host\t/",
		"amqp://guest:s3cr3t-P4ss@host:5672/\x00",
		"http://guest:s3cr3t-P4ss@host/",
		"AMQP://guest:s3cr3t-P4ss@host:x/",
		"amqps://guest:s3cr3t-P4ss@host:bad/",
		"guest:s3cr3t-P4ss@host",
		"amqp:guest:s3cr3t-P4ss@host",
		"amqp:/guest:s3cr3t-P4ss@host:x",
		"amqp://:s3cr3t-P4ss@host:bad/",
		"amqp://guest:s3cr3t-P4ss@host/?heartbeat=x",
		"amqp://guest:s3cr3t-P4ss@host/?heartbeat=99999999",
		"amqp://guest:s3cr3t-P4ss@host/?connection_timeout=x",
		"amqp://guest:s3cr3t-P4ss@host/?channel_max=x",
		"amqp://guest:s3cr3t/P4ss@host:5672/", // unescaped '/', '?', '#' in the password
		"amqp://guest:s3cr3t?P4ss@host:5672/",
		"amqp://guest:s3cr3t#P4ss@host:5672/",
		"amqp://guest:s3cr3t/P4ss@[::1/",
		"amqp://guest:s3cr3t%P4ss@host/",
		"amqp://guest:5672/s3cr3t-P4ss@host/",
		"amqp://guest:5672?s3cr3t-P4ss@host/",
	}
	valid = []string{ // no broker answers, or not to this password
		"amqp://guest:s3cr3t-P4ss@" + refused + "/",
		"amqp://guest:s3cr3t-P4ss@" + refused + "/vhost?heartbeat=5",
		"amqp://guest:s3cr3t%2DP4ss@" + refused + "/",
		"amqps://guest:s3cr3t-P4ss@" + refused + "/",
		"amqp://guest:s3cr3t-P4ss@[::1]:" + strings.Split(refused, ":")[1] + "/",
		"amqp://guest:s3cr3t-P4ss@localhost:" + strings.Split(refused, ":")[1] + "/",
		"amqp://guest:s3cr3t-P4ss@nosuchhost.invalid:5672/",
		"amqp://guest:s3cr3t-P4ss@" + hole + "/",
		"amqp://guest:s3cr3t-P4ss@" + hole + "/?connection_timeout=100",
		"amqp://guest:s3cr3t-P4ss@" + hostOf(testenv.URL()) + "/",
	}
	return malformed, valid
}

// hostOf returns the host:port of a valid URL.
func hostOf(raw string) string {
	u, err := neturl.Parse(raw)
	if err != nil {
		panic(err)
	}
	return u.Host
}

// cli runs warren with args and returns everything it printed, and its error.
func cli(args ...string) (string, error) {
	root := newRoot()
	var out syncBuffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	if err != nil {
		_, _ = out.Write([]byte("\n" + err.Error()))
	}
	return out.String(), err
}

// No error, output or help text shows a password of the URL (url.Error quotes the whole URL,
// and `warren --help` shows $WARREN_AMQP_URL's default), and a malformed URL's error still
// names the field.
func TestNoPasswordInAnyErrorOrOutput(t *testing.T) {
	t.Parallel()
	testenv.Slow(t)
	const limit = 300 * time.Millisecond
	bad, good := urls(t)
	require.GreaterOrEqual(t, len(bad)+len(good), 40)
	for i, raw := range append(bad, good...) {
		malformed := i < len(bad)
		t.Run(strings.NewReplacer("/", "_").Replace(raw), func(t *testing.T) {
			t.Parallel()
			check := func(what, field string, err error) {
				t.Helper()
				if !assert.Error(t, err, "%s %q", what, raw) {
					return
				}
				for _, part := range secretParts {
					assert.NotContains(t, err.Error(), part, "%s %q", what, raw)
				}
				if malformed {
					assert.Contains(t, err.Error(), field, "%s %q", what, raw)
				} else {
					assert.Contains(t, err.Error(), "gave up after "+limit.String(), "%s %q", what, raw)
				}
			}
			_, err := router.New(router.Config{Connection: warren.Connection{URL: raw, ConnectTimeout: limit}}, nil)
			check("router.New", "router: Config.Connection.URL", err)
			_, err = dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: raw, ConnectTimeout: limit}}, nil)
			check("dlx.NewPublisher", "dlx: Config.Connection.URL", err)
			sub, err := consumer.NewSubscriber(consumer.Config{Connection: warren.Connection{URL: raw, ConnectTimeout: limit}}, nil)
			if err == nil {
				err = sub.SubscribeInitialize("q")
				_ = sub.Close()
			}
			check("consumer.NewSubscriber", "consumer: Config.Connection.URL", err)
			k, err := kill.NewKiller(kill.Config{Connection: warren.Connection{URL: raw}, PublishTimeout: limit}, nil)
			if err == nil {
				err = k.Kill(context.Background(), "q", kill.Stop)
			}
			check("kill.NewKiller", "kill: Config.Connection.URL", err)
			b, err := topology.NewBuilder(topology.Config{Timeout: limit}, nil)
			require.NoError(t, err)
			check("Builder.Apply", "topology: apply: Connection.URL", b.Apply(context.Background(), warren.Connection{URL: raw, ConnectTimeout: limit}, topology.Topology{}))
			for _, args := range [][]string{{"kill", "q"}, {"delays", "verify"}, {"publish", "q", "--file", "/dev/null"},
				{"status", "q"}, {"poison", "list", "q"}, {"poison", "replay", "q"}, {"parked", "list"}} {
				out, err := cli(append([]string{"--url", raw, "--timeout", limit.String()}, args...)...)
				check("warren "+args[0], "--url: Connection.URL", err)
				for _, part := range secretParts {
					assert.NotContains(t, out, part, "warren --url %q %v: %s", raw, args, out)
				}
			}
		})
	}
}

// The URL of $WARREN_AMQP_URL shows in no help text and no output.
//
// Not parallel: it sets $WARREN_AMQP_URL.
func TestNoPasswordFromTheEnvironment(t *testing.T) {
	testenv.Slow(t)
	bad, good := urls(t)
	for _, raw := range append(bad, good...) {
		if strings.ContainsRune(raw, 0) {
			continue // no environment variable holds it
		}
		t.Setenv("WARREN_AMQP_URL", raw)
		for _, args := range [][]string{{"--help"}, {"kill", "--help"}, {"resume", "--help"}, {"kill", "q", "--timeout", "300ms"},
			{"publish", "--help"}, {"delays", "remove", "--help"}, {"topology", "verify", "--help"}, {"delays", "verify", "--timeout", "300ms"},
			{"status", "--help"}, {"poison", "replay", "--help"}, {"status", "q", "--timeout", "300ms"}, {"poison", "list", "q", "--timeout", "300ms"}} {
			out, _ := cli(args...)
			for _, part := range secretParts {
				assert.NotContains(t, out, part, "warren %v with $WARREN_AMQP_URL=%q: %s", args, raw, out)
			}
		}
	}
	t.Setenv("WARREN_AMQP_URL", "amqp://ops:s3cr3t-P4ss@broker.example:5672/prod")
	out, err := cli("--help")
	require.NoError(t, err)
	assert.Contains(t, out, "$WARREN_AMQP_URL: amqp://ops:xxxxx@broker.example:5672/prod", "the default is still shown")
}
