package topology

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.yaml.in/yaml/v3"
)

// File is a topology file: the Config that declares it and the Topology itself, the same
// model that Go code passes to a Builder.
//
// A file holds both because the Topology alone does not say how it is declared: the queue
// type, the delivery limit and the delay levels its work queues are bound from are in the
// Config, and a Topology declared with another Config is another topology on the broker
// (other queue arguments, other delay levels). The Topology's fields sit at the top level
// of the file, next to "config", so a file that holds only exchanges, queues and bindings
// is a File too, declared with the default Config:
//
//	config:                 # optional; every field has the default of topology.Config
//	  queue_type: quorum
//	  delivery_limit: 20
//	  delay: {prefix: warren.delay, unit: 1ms, radix: 16}
//	exchanges:
//	  - {name: events, kind: topic}
//	queues:
//	  - {name: billing}
//	bindings:
//	  - {exchange: events, queue: billing, key: "order.*"}
//
// Keys are the snake_case names of the Go fields (DeliveryLimit is delivery_limit), the
// same in YAML and JSON; durations are Go durations ("1ms", "2s"). Config.Timeout is not
// part of a file (it bounds the calls of one run, not what is declared): set it in Go, or
// with the CLI's --timeout.
type File struct {
	// Config is how the Topology is declared.
	Config Config `yaml:"config,omitempty" json:"config,omitempty"`
	// Topology is what is declared. Its fields are at the top level of the file.
	Topology `yaml:",inline"`
}

// Validate reports the first field of f that is not usable: Config.Validate, then
// Topology.ValidateWith(Config), then a Config.DeliveryLimit with a classic Config.QueueType
// that no work queue of the file would have (none is quorum).
func (f File) Validate() error {
	if err := f.Config.Validate(); err != nil {
		return err
	}
	if err := f.ValidateWith(f.Config); err != nil {
		return err
	}
	if f.Config.DeliveryLimit == 0 || f.Config.WithDefaults().QueueType != Classic {
		return nil
	}
	for _, q := range f.Queues {
		if q.Type == Quorum {
			return nil
		}
	}
	return fmt.Errorf("topology: Config.DeliveryLimit %d: the queue type is classic and no work queue of the file is quorum; "+
		"a classic queue has no delivery limit (it would be ignored): remove it", f.Config.DeliveryLimit)
}

// Load reads the topology file at path (YAML or JSON) with Parse. Errors name path.
func Load(path string) (File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return File{}, fmt.Errorf("topology: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		return File{}, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Parse reads a topology file, YAML or JSON (YAML is a superset of JSON), and validates it
// (File.Validate). A field the model does not have is an error naming it and its line, so
// a misspelt key is never ignored; so is a second document in the data. Nested maps in
// Args become amqp.Table, which the broker takes as a table argument.
func Parse(data []byte) (File, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f File
	switch err := dec.Decode(&f); {
	case errors.Is(err, io.EOF):
		return File{}, errors.New("topology: the file is empty")
	case err != nil:
		return File{}, fmt.Errorf("topology: %w", err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return File{}, errors.New("topology: the file holds more than one YAML document")
	}
	for i := range f.Exchanges {
		if err := tableArgs(f.Exchanges[i].Args, fmt.Sprintf("Exchanges[%d].Args", i)); err != nil {
			return File{}, err
		}
	}
	for i := range f.Queues {
		if err := tableArgs(f.Queues[i].Args, fmt.Sprintf("Queues[%d].Args", i)); err != nil {
			return File{}, err
		}
	}
	if err := f.Validate(); err != nil {
		return File{}, err
	}
	return f, nil
}

// tableArgs turns the maps and lists nested in args, as YAML decodes them, into the AMQP
// types, and reports a value the broker cannot take, naming field.
func tableArgs(args amqp.Table, field string) error {
	for k, v := range args {
		args[k] = amqpValue(v)
	}
	if err := args.Validate(); err != nil {
		return fmt.Errorf("topology: %s: %w", field, err)
	}
	return nil
}

func amqpValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		t := amqp.Table{}
		for k, x := range v {
			t[k] = amqpValue(x)
		}
		return t
	case []any:
		for i, x := range v {
			v[i] = amqpValue(x)
		}
	}
	return v
}

// MarshalJSON writes d with Unit as a Go duration ("1ms"), as a topology file has it, not
// in nanoseconds.
func (d Delay) MarshalJSON() ([]byte, error) {
	type plain Delay
	v := struct {
		plain
		Unit string `json:"unit,omitempty"`
	}{plain: plain(d)}
	if d.Unit != 0 {
		v.Unit = d.Unit.String()
	}
	return json.Marshal(v)
}

// UnmarshalJSON reads what MarshalJSON writes: Unit is a Go duration ("1ms").
func (d *Delay) UnmarshalJSON(data []byte) error {
	type plain Delay
	v := struct {
		*plain
		Unit string `json:"unit,omitempty"`
	}{plain: (*plain)(d)}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	if v.Unit != "" {
		u, err := time.ParseDuration(v.Unit)
		if err != nil {
			return fmt.Errorf("topology: Delay.Unit %q: %w", v.Unit, err)
		}
		d.Unit = u
	}
	return nil
}
