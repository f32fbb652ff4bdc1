package foreign_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

var (
	installOnce sync.Once
	nodePath    string // amqplib's node_modules, for NODE_PATH
	installErr  error
)

// amqplib installs amqplib once per test binary (scripts/amqplib.sh) and returns its
// NODE_PATH. A machine without it fails the test: it is never a skip (but under -short,
// where testenv skips every broker test first).
func amqplib(t *testing.T) string {
	t.Helper()
	installOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*testenv.Patience())
		defer cancel()
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "../../scripts/amqplib.sh")
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		nodePath = lines[len(lines)-1]
		if err != nil || nodePath == "" {
			installErr = fmt.Errorf("scripts/amqplib.sh: %w: %s", err, stderr.String())
		}
	})
	if installErr != nil {
		t.Fatalf("no amqplib: %v", installErr)
	}
	return nodePath
}

// node runs testdata/amqplib.js with args and returns what it printed.
func node(t *testing.T, args ...string) []byte {
	t.Helper()
	path := amqplib(t)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "node", append([]string{"testdata/amqplib.js"}, args...)...)
	cmd.Env = append(os.Environ(), "NODE_PATH="+path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "node amqplib.js %s: %s", args[0], stderr.String())
	return out
}

// user is the user name of the broker's URL: the only user-id the broker lets it publish.
func user(t *testing.T, env *testenv.Env) string {
	t.Helper()
	u, err := url.Parse(strings.Split(env.URL, ",")[0])
	require.NoError(t, err)
	return u.User.Username()
}

// A message amqplib publishes with every basic property reaches a warren handler with each
// of them as metadata (the property winning over a header of the same name).
func TestForeignPropertiesReachAHandler(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("from-node")
	r, err := router.New(router.Config{
		Connection:      env.Connection(),
		ShutdownTimeout: 10 * time.Second,
		Topology:        topology.Config{Delay: env.Delay(topology.Delay{})},
	}, env.Logger())
	require.NoError(t, err)
	got := make(chan *message.Message, 1)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
		got <- msg
		return nil
	}))
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	defer func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
	}()
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router stopped: %v", err)
	case <-time.After(testenv.Patience()):
		t.Fatal("router did not start")
	}

	ts := time.Date(2026, 11, 25, 17, 30, 5, 0, time.UTC)
	spec, err := json.Marshal(map[string]any{"body": `{"order":42}`, "properties": map[string]any{
		"contentType": "application/json", "contentEncoding": "gzip", "correlationId": "corr-42",
		"replyTo": "replies", "type": "order.created", "appId": "node-shop", "userId": user(t, env),
		"timestamp": ts.Unix(), "priority": 7, "expiration": "600000", "messageId": "node-1",
		"persistent": true,
		"headers":    map[string]any{"tenant": "acme", "count": 42, warren.MetadataContentType: "text/plain"},
	}})
	require.NoError(t, err)
	node(t, "publish", env.URL, queue, string(spec))

	var msg *message.Message
	select {
	case msg = <-got:
	case <-time.After(testenv.Patience()):
		t.Fatal("the handler got nothing")
	}
	assert.Equal(t, "node-1", msg.UUID)
	assert.Equal(t, `{"order":42}`, string(msg.Payload))
	md := msg.Metadata
	assert.Equal(t, "application/json", md.Get(warren.MetadataContentType), "the property wins over the header")
	assert.Equal(t, "gzip", md.Get(warren.MetadataContentEncoding))
	assert.Equal(t, "corr-42", md.Get(warren.MetadataCorrelationID))
	assert.Equal(t, "replies", md.Get(warren.MetadataReplyTo))
	assert.Equal(t, "order.created", md.Get(warren.MetadataType))
	assert.Equal(t, "node-shop", md.Get(warren.MetadataAppID))
	assert.Equal(t, user(t, env), md.Get(warren.MetadataUserID))
	assert.Equal(t, "2026-11-25T17:30:05Z", md.Get(warren.MetadataTimestamp))
	assert.Equal(t, "7", md.Get(warren.MetadataPriority))
	assert.Equal(t, "600000", md.Get(warren.MetadataExpiration))
	assert.Equal(t, "acme", md.Get("tenant"))
	assert.Equal(t, "42", md.Get("count"))
}

// delivered is what amqplib reads of a message.
type delivered struct {
	Body       string `json:"body"`
	Properties struct {
		ContentType     string         `json:"contentType"`
		ContentEncoding string         `json:"contentEncoding"`
		CorrelationID   string         `json:"correlationId"`
		ReplyTo         string         `json:"replyTo"`
		Type            string         `json:"type"`
		AppID           string         `json:"appId"`
		UserID          *string        `json:"userId"`
		Timestamp       int64          `json:"timestamp"`
		Priority        int            `json:"priority"`
		Expiration      string         `json:"expiration"`
		MessageID       string         `json:"messageId"`
		DeliveryMode    int            `json:"deliveryMode"`
		Headers         map[string]any `json:"headers"`
	} `json:"properties"`
}

// What warren publishes with property metadata reaches an amqplib consumer as real
// properties, user-id as the header amqp_user_id.
func TestForeignConsumerSeesProperties(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("to-node")
	p, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})}}, env.Logger())
	require.NoError(t, err)
	defer p.Close()

	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":42}`))
	for k, v := range map[string]string{
		warren.MetadataContentType:     "application/json",
		warren.MetadataContentEncoding: "gzip",
		warren.MetadataCorrelationID:   "corr-42",
		warren.MetadataReplyTo:         "replies",
		warren.MetadataType:            "order.created",
		warren.MetadataAppID:           "shop",
		warren.MetadataUserID:          "someoneelse",
		warren.MetadataTimestamp:       "2026-11-25T17:30:05Z",
		warren.MetadataPriority:        "9",
		warren.MetadataExpiration:      "600000",
		"tenant":                       "acme",
	} {
		msg.Metadata.Set(k, v)
	}
	require.NoError(t, p.Publish(queue, msg))

	var d delivered
	out := node(t, "get", env.URL, queue, "30000")
	require.NoError(t, json.Unmarshal(out, &d), "%s", out)
	t.Logf("amqplib read: %s", out)
	pr := d.Properties
	assert.Equal(t, `{"order":42}`, d.Body)
	assert.Equal(t, "application/json", pr.ContentType)
	assert.Equal(t, "gzip", pr.ContentEncoding)
	assert.Equal(t, "corr-42", pr.CorrelationID)
	assert.Equal(t, "replies", pr.ReplyTo)
	assert.Equal(t, "order.created", pr.Type)
	assert.Equal(t, "shop", pr.AppID)
	assert.Nil(t, pr.UserID, "user-id is never the property")
	assert.Equal(t, time.Date(2026, 11, 25, 17, 30, 5, 0, time.UTC).Unix(), pr.Timestamp)
	assert.Equal(t, 9, pr.Priority)
	assert.Equal(t, "600000", pr.Expiration)
	assert.Equal(t, msg.UUID, pr.MessageID)
	assert.Equal(t, 2, pr.DeliveryMode)
	assert.Equal(t, "someoneelse", pr.Headers[warren.MetadataUserID])
	assert.Equal(t, "acme", pr.Headers["tenant"])
	for k := range pr.Headers {
		if strings.HasPrefix(k, "amqp_") {
			assert.Equal(t, warren.MetadataUserID, k, "a property sent as a header too")
		}
	}
}
