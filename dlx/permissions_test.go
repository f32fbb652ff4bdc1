package dlx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// The permission recipe of docs/dead-lettering.md, on a throwaway node: the user warren's
// services run as may do anything in the virtual host; an application user may write to its
// work exchange alone. The application's publish to the work exchange reaches the work
// queue; its forged message is refused whether it goes straight into a delay level (the
// default exchange) or through a level exchange; warren's delayed publish still arrives, and
// dead-lettering still works.
func TestPermissionRecipeKeepsApplicationsOutOfTheDelayLevels(t *testing.T) {
	node := testenv.StartNode(t)
	const exchange, queue = "orders", "billing"
	// The recipe.
	for _, args := range [][]string{
		{"add_user", "warren", "warren-secret"},
		{"set_permissions", "-p", "/", "warren", ".*", ".*", ".*"},
		{"add_user", "app", "app-secret"},
		{"set_permissions", "-p", "/", "app", "^$", "^orders$", "^$"},
	} {
		out, err := node.Ctl(args...)
		require.NoError(t, err, out)
	}
	warrenURL := fmt.Sprintf("amqp://warren:warren-secret@%s/", node.Addr())
	appURL := fmt.Sprintf("amqp://app:app-secret@%s/", node.Addr())

	cfg := topology.Config{Delay: topology.Delay{Levels: 3}}
	pub, err := dlx.NewPublisher(dlx.Config{
		Connection: warren.Connection{URL: warrenURL},
		Topology:   cfg,
		Declare: topology.Topology{
			Exchanges: []topology.Exchange{{Name: exchange, Kind: topology.Topic}},
			Queues:    []topology.Queue{{Name: queue}},
			Bindings:  []topology.Binding{{Exchange: exchange, Queue: queue, Key: "order.*"}},
		},
	}, nil)
	require.NoError(t, err)
	defer pub.Close()
	d := pub.Delay()

	conn, err := amqp.Dial(appURL)
	require.NoError(t, err)
	defer conn.Close()
	publish := func(exchange, key string, headers amqp.Table) error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer ch.Close()
		if err := ch.Confirm(false); err != nil {
			return err
		}
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), exchange, key, false, false, amqp.Publishing{
			Headers: headers, Body: []byte(key), DeliveryMode: amqp.Persistent,
		})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(t.Context(), testenv.Patience())
		defer cancel()
		ok, err := dc.WaitContext(ctx)
		if err == nil && !ok { // a refusal closes the channel, which nacks what it had
			select {
			case e := <-closed:
				return e
			case <-ctx.Done():
				return errors.New("nacked")
			}
		}
		return err
	}
	refused := func(err error) {
		t.Helper()
		var ae *amqp.Error
		require.True(t, errors.As(err, &ae), "refused: %v", err)
		assert.Equal(t, amqp.AccessRefused, ae.Code, "%v", err)
	}

	require.NoError(t, publish(exchange, "order.created", nil), "the application publishes to its work exchange")
	forged := amqp.Table{"x-death": testenv.ForgedXDeath, contract.DestQueueHeader: queue}
	err = publish("", d.LevelQueue(0, 1), forged)
	refused(err)
	t.Logf("straight into a level: %v", err)
	plan, err := d.Plan(time.Millisecond)
	require.NoError(t, err)
	for k, v := range plan.Headers {
		forged[k] = v
	}
	err = publish(plan.Exchange, queue, forged)
	refused(err)
	t.Logf("through a level exchange: %v", err)
	refused(publish("", queue, nil)) // nor the default exchange to a work queue
	refused(publish(d.DeliveryExchange(), queue, forged))

	m := message.NewMessage(watermill.NewUUID(), []byte("delayed"))
	warren.Delay(m, 300*time.Millisecond)
	require.NoError(t, pub.Publish(queue, m), "warren's delayed publish")

	wc, err := amqp.Dial(warrenURL)
	require.NoError(t, err)
	defer wc.Close()
	ch, err := wc.Channel()
	require.NoError(t, err)
	got := map[string]bool{}
	require.Eventually(t, func() bool {
		for {
			msg, ok, err := ch.Get(queue, true)
			require.NoError(t, err)
			if !ok {
				return got["order.created"] && got["delayed"]
			}
			got[string(msg.Body)] = true
		}
	}, testenv.Patience(), 20*time.Millisecond, "got %v", got)
	assert.Len(t, got, 2, "nothing forged arrived: %v", got)
	for _, row := range node.ListQueues() {
		assert.Equal(t, "running", row.State, row.Name)
		assert.Zero(t, row.Messages, "%s holds nothing", row.Name)
	}
}
