package amqpx_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
)

func TestSplitURLs(t *testing.T) {
	for raw, want := range map[string][]string{
		"amqp://a/":                           {"amqp://a/"},
		"amqp://a/,amqp://b/":                 {"amqp://a/", "amqp://b/"},
		"amqp://u:p@a:5672/, amqps://u:p@b/v": {"amqp://u:p@a:5672/", "amqps://u:p@b/v"},
		"amqp://u:p,w@a/,AMQP://u:x,y,z@b/":   {"amqp://u:p,w@a/", "AMQP://u:x,y,z@b/"},
		"amqp://u:p,amqp@a/":                  {"amqp://u:p,amqp@a/"},
		"":                                    {""},
	} {
		assert.Equal(t, want, amqpx.SplitURLs(raw), raw)
	}
}

// Every password of a list is redacted, in a URL shown and in an error's text.
func TestRedactURLList(t *testing.T) {
	raw := "amqp://u:s3cr3t@a:5672/,amqp://v:p4ss,w0rd@b:5672/"
	assert.Equal(t, "amqp://u:xxxxx@a:5672/,amqp://v:xxxxx@b:5672/", amqpx.RedactURL(raw))
	err := amqpx.RedactError(raw, errorf("dial amqp://u:s3cr3t@a:5672/ and amqp://v:p4ss,w0rd@b:5672/"))
	for _, secret := range []string{"s3cr3t", "p4ss", "w0rd"} {
		assert.NotContains(t, err.Error(), secret)
	}
	err = amqpx.CheckURL("amqp://u:s3cr3t@a:5672/,amqp://v:p4ss@b:port/")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "URL 2 of 2")
	assert.NotContains(t, err.Error(), "p4ss")
}

type errorf string

func (e errorf) Error() string { return string(e) }

// refusedURL returns the URL of a port nobody listens on.
func refusedURL(t *testing.T) string {
	return "amqp://guest:s3cr3t@" + testenv.ClosedPort(t) + "/"
}

// A list is tried in a random order until a node answers: a node down is passed over
// whatever its place.
func TestDialTriesEveryNodeOfAList(t *testing.T) {
	list := refusedURL(t) + "," + testenv.URL() + "," + refusedURL(t)
	for range 6 {
		conn, err := amqpx.Dial(context.Background(), list, "test")
		require.NoError(t, err)
		require.NoError(t, conn.Close())
	}
}

// When no node answers, the error names every node (without its password) and why.
func TestDialOfAListWithoutALiveNodeNamesEveryNode(t *testing.T) {
	a, b := refusedURL(t), "amqp://guest:s3cr3t@"+blackHole(t)+"/"
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := amqpx.Dial(ctx, a+","+b, "test")
	// Each node gets a share of the time left: the black hole, tried first, half of it.
	assert.LessOrEqual(t, time.Since(start), 1100*time.Millisecond+150*time.Millisecond)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no node of 2 answered")
	for _, u := range []string{a, b} {
		assert.Contains(t, err.Error(), amqpx.RedactURL(u))
	}
	assert.NotContains(t, err.Error(), "s3cr3t")
	assert.True(t, strings.Contains(err.Error(), "refused"), err.Error())
}
