package topology_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/warrenmq/warren/topology"
)

func TestParkingQueueNameAndParse(t *testing.T) {
	for _, d := range []topology.Delay{
		{},
		{QueueType: topology.Classic},
		{Prefix: "elsewhere", Unit: time.Second, Radix: 4},
	} {
		name := d.ParkingQueue()
		assert.Equal(t, topology.ParkingQueueName(d.Name()), name)
		layout, ok := topology.ParseParkingQueue(name)
		assert.True(t, ok, name)
		assert.Equal(t, d.Name(), layout)
	}
	assert.Equal(t, "warren.delay.quorum.1ms.r16.parked", topology.Delay{}.ParkingQueue())
	for _, q := range []string{"orders", topology.PoisonQueue("orders"), "orders.parked", "warren.delay.quorum.1ms.r16",
		"warren.delay.quorum.1ms.r16.parked.x", "warren.delay.stream.1ms.r16.parked", "warren.delay.1ms.r16.parked"} {
		_, ok := topology.ParseParkingQueue(q)
		assert.False(t, ok, q)
	}
}
