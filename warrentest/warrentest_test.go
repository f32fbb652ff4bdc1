package warrentest_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
	"github.com/warrenmq/warren/warrentest"
)

func TestConfigNamesAnUnknownVersion(t *testing.T) {
	assert.NoError(t, warrentest.Config{}.Validate())
	assert.NoError(t, warrentest.Config{Version: "4.0"}.Validate())
	assert.ErrorContains(t, warrentest.Config{Version: "3.8"}.Validate(), "Config.Version")
}

// What a handler publishes, and what the broker did, in order.
func TestTheJournalTellsWhatHappened(t *testing.T) {
	warrentest.Run(t, warrentest.Config{}, func(t *testing.T, b *warrentest.Broker) {
		r, err := router.New(router.Config{Connection: b.Connection(), Topology: topology.Config{Delay: topology.Delay{Disabled: true}}},
			watermill.NopLogger{})
		require.NoError(t, err)
		require.NoError(t, r.AddHandler(router.HandlerConfig{Queue: "orders", PublishTopic: "invoices"},
			func(m *message.Message) ([]*message.Message, error) {
				return []*message.Message{message.NewMessage("invoice-of-"+m.UUID, m.Payload)}, nil
			}))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		<-r.Running()
		require.NoError(t, r.Publisher().Publish("orders", message.NewMessage("o1", []byte("{}"))))
		b.Idle()

		invoices := b.Published("invoices")
		require.Len(t, invoices, 1)
		assert.Equal(t, "invoice-of-o1", invoices[0].ID)
		var kinds []string
		for _, e := range b.Journal() {
			if e.ID == "o1" {
				kinds = append(kinds, e.Kind)
			}
		}
		assert.Equal(t, []string{"published", "delivered", "acked"}, kinds)
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, r.Close())
	})
}

// A client other than warren's reaches the broker through Dial: here amqp091-go's, publishing
// and getting a message a day after it was due to expire.
func TestAnotherClientDialsTheBroker(t *testing.T) {
	warrentest.Run(t, warrentest.Config{Version: "4.0"}, func(t *testing.T, b *warrentest.Broker) {
		conn, err := amqp.DialConfig(b.URL(), amqp.Config{Dial: func(string, string) (net.Conn, error) { return b.Dial() }})
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		_, err = ch.QueueDeclare("later", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		require.NoError(t, err)
		require.NoError(t, ch.Confirm(false))
		for _, body := range []string{"kept", "expires"} {
			p := amqp.Publishing{Body: []byte(body)}
			if body == "expires" {
				p.Expiration = "3600000"
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", "later", false, false, p)
			require.NoError(t, err)
			require.True(t, dc.Wait())
		}
		b.Advance(24 * time.Hour)
		d, ok, err := ch.Get("later", true)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, "kept", string(d.Body))
		_, ok, err = ch.Get("later", true)
		require.NoError(t, err)
		assert.False(t, ok, "expired an hour after it was published")
	})
}
