package topology_test

import (
	"encoding/json"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/warrenmq/warren/topology"
)

const exampleFile = "../examples/topology/topology.yaml"

// The example file is the model Go code would write.
func TestLoadExampleFile(t *testing.T) {
	f, err := topology.Load(exampleFile)
	require.NoError(t, err)
	assert.Equal(t, topology.Config{
		QueueType:     topology.Quorum,
		DeliveryLimit: 20,
		ExchangeKind:  topology.Topic,
		Delay:         topology.Delay{Prefix: "shop.delay", Unit: time.Millisecond, Radix: 16, Levels: 6},
	}, f.Config)
	assert.Equal(t, topology.Topology{
		Exchanges: []topology.Exchange{
			{Name: "shop.events", Kind: topology.Topic, AlternateExchange: "shop.unrouted"},
			{Name: "shop.unrouted", Kind: topology.Fanout},
		},
		Queues: []topology.Queue{
			{Name: "shop.billing"},
			{Name: "shop.shipping", DeliveryLimit: 5},
			{Name: "shop.audit", Type: topology.Classic, Args: amqp.Table{"x-max-length": 100000}},
			{Name: "shop.unrouted"},
		},
		Bindings: []topology.Binding{
			{Exchange: "shop.events", Queue: "shop.billing", Key: "order.*"},
			{Exchange: "shop.events", Queue: "shop.shipping", Key: "order.paid"},
			{Exchange: "shop.events", Queue: "shop.audit", Key: "#"},
			{Exchange: "shop.unrouted", Queue: "shop.unrouted"},
		},
	}, f.Topology)
}

// JSON is read as YAML, with the same keys; a file of only a topology has the default Config.
func TestParseJSON(t *testing.T) {
	f, err := topology.Parse([]byte(`{"queues": [{"name": "q", "args": {"x-tbl": {"a": [1, {"b": "c"}]}}}],
		"bindings": [{"exchange": "amq.topic", "queue": "q", "headers": {"k": "v"}, "match_any": true}]}`))
	require.NoError(t, err)
	assert.Equal(t, topology.Config{}, f.Config)
	assert.Equal(t, amqp.Table{"x-tbl": amqp.Table{"a": []any{1, amqp.Table{"b": "c"}}}}, f.Queues[0].Args,
		"nested maps are AMQP tables")
	assert.Equal(t, topology.Binding{Exchange: "amq.topic", Queue: "q", Headers: map[string]string{"k": "v"}, MatchAny: true}, f.Bindings[0])
}

func TestParseErrorsNameTheField(t *testing.T) {
	for data, want := range map[string]string{
		"queues: [{name: q, delivery_limt: 3}]":           "line 1: field delivery_limt not found in type topology.Queue",
		"config: {delay: {prefx: p}}":                     "field prefx not found in type topology.Delay",
		"config: {timeout: 1s}":                           "field timeout not found in type topology.Config",
		"exchange: [{name: e}]":                           "field exchange not found in type topology.File",
		"queues: [{name: q, delivery_limit: -1}]":         "Queues[0].DeliveryLimit -1 is negative",
		"bindings: [{exchange: e}]":                       "Bindings[0] needs exactly one of Queue and ToExchange",
		"config: {delay: {unit: 1.5ms}}":                  "Delay.Unit 1.5ms is not a whole number of milliseconds",
		"config: {delay: {unit: soon}}":                   "cannot unmarshal !!str `soon` into time.Duration",
		"config: {queue_type: stream}":                    `QueueType "stream" is neither`,
		"exchanges: [{name: e, kind: fan}]":               `Exchanges[0].Kind "fan" is not one of`,
		"queues: [{name: q, args: {x-when: 2024-01-01}}]": "",
		"queues: [{name: q}]\n---\nqueues: [{name: r}]":   "more than one YAML document",
		"": "the file is empty",
		"queues: [{name: q, args: {x-set: {a: {b: null}}}}]": "",
	} {
		_, err := topology.Parse([]byte(data))
		if want == "" {
			assert.NoError(t, err, data)
			continue
		}
		assert.ErrorContains(t, err, want, data)
	}
	_, err := topology.Load("testdata/no-such-file.yaml")
	assert.ErrorContains(t, err, "no-such-file.yaml")
}

// What yaml.Marshal and json.Marshal write, Parse reads back.
func TestFileRoundTrip(t *testing.T) {
	f, err := topology.Load(exampleFile)
	require.NoError(t, err)
	for name, marshal := range map[string]func(any) ([]byte, error){"yaml": yaml.Marshal, "json": json.Marshal} {
		data, err := marshal(f)
		require.NoError(t, err, name)
		back, err := topology.Parse(data)
		require.NoError(t, err, "%s:\n%s", name, data)
		assert.Equal(t, f.Config, back.Config, name)
		assert.Equal(t, f.Bindings, back.Bindings, name)
		assert.Len(t, back.Queues, len(f.Queues), name)
	}
	data, err := json.Marshal(f.Config.Delay)
	require.NoError(t, err)
	assert.JSONEq(t, `{"prefix": "shop.delay", "unit": "1ms", "radix": 16, "levels": 6}`, string(data))
	var d topology.Delay
	require.NoError(t, json.Unmarshal(data, &d))
	assert.Equal(t, f.Config.Delay, d)
}
