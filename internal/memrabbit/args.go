package memrabbit

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// What RabbitMQ refuses in what a client sends, and how it reads what it takes: a queue's
// arguments, a headers binding's x-match, a message's expiration and its CC and BCC headers
// (measured on 3.10.8 and 4.0.5, which refuse alike but where noted).

// queueArgs are the arguments each queue type takes (RabbitMQ's queue_arguments). A queue
// refuses an argument that only other types take; one that no type takes is ignored.
var queueArgs = map[string][]string{
	"classic": {"x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-length",
		"x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version", "x-single-active-consumer",
		"x-queue-type", "x-queue-master-locator"},
	"quorum": {"x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy", "x-expires", "x-max-length",
		"x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes", "x-message-ttl", "x-overflow",
		"x-single-active-consumer", "x-queue-type", "x-quorum-initial-group-size", "x-delivery-limit", "x-queue-leader-locator"},
	"stream": {"x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
		"x-queue-leader-locator"},
}

// argKinds are the kinds of value RabbitMQ checks an argument's against: "int" any integer
// (and its bounds below), "string" a longstr, "bool" a bool.
var argKinds = map[string]string{
	"x-message-ttl": "int", "x-expires": "int", "x-max-length": "int", "x-max-length-bytes": "int", "x-max-priority": "int",
	"x-queue-version": "int", "x-quorum-initial-group-size": "int", "x-max-in-memory-length": "int",
	"x-max-in-memory-bytes": "int", "x-initial-cluster-size": "int", "x-stream-max-segment-size-bytes": "int",
	"x-overflow": "string", "x-dead-letter-routing-key": "string", "x-queue-mode": "string", "x-dead-letter-strategy": "string",
	"x-queue-leader-locator": "string", "x-max-age": "string", "x-queue-type": "string",
	"x-single-active-consumer": "bool",
}

// argValues are the values a string argument may take, and RabbitMQ's refusal of another
// (%s: the value).
var argValues = map[string]struct {
	values  []string
	refusal string
}{
	"x-overflow":             {[]string{"drop-head", "reject-publish", "reject-publish-dlx"}, "invalid_overflow"},
	"x-queue-mode":           {[]string{"default", "lazy"}, `"unsupported queue mode '%s'"`},
	"x-queue-leader-locator": {[]string{"client-local", "balanced", "random", "least-leaders"}, "invalid_queue_locator_arg"},
	"x-dead-letter-strategy": {[]string{"at-most-once", "at-least-once"}, "invalid_dlx_strategy"},
}

// maxExpiry is the longest x-message-ttl and x-expires RabbitMQ takes, in milliseconds.
const maxExpiry = 1<<32 - 1

// argsRefusal is RabbitMQ's refusal of a queue name declared with args, or nil: a dead-letter
// exchange that is not a string; a queue type it does not have; an argument of another type
// of queue; a value of the wrong kind or out of bounds.
func (b *Broker) argsRefusal(name string, args Table) error {
	refuse := func(arg string, why any) error {
		return channelErr(PreconditionFailed, "PRECONDITION_FAILED - invalid arg '%s' for queue '%s' in vhost '/': %s", arg, name, why)
	}
	if v, ok := args["x-dead-letter-exchange"]; ok {
		if _, ok := v.(string); !ok {
			return channelErr(PreconditionFailed, "PRECONDITION_FAILED - invalid type '%s' for arg 'x-dead-letter-exchange' in queue '%s' in vhost '/'", fieldType(v), name)
		}
	}
	kind := "classic"
	if v, ok := args["x-queue-type"]; ok {
		s, ok := v.(string)
		if !ok {
			return refuse("x-queue-type", unacceptable(v))
		}
		if _, ok := queueArgs[s]; !ok {
			return refuse("x-queue-type", fmt.Sprintf(`"unsupported queue type '%s'"`, s))
		}
		kind = s
	}
	takes := queueArgs[kind]
	if kind == "classic" && b.atLeast(4, 0) {
		takes = append(slices.Clip(takes), "x-queue-leader-locator")
	}
	sorted := slices.Sorted(maps.Keys(args)) // one refusal of several: the same each time
	for _, arg := range sorted {
		if !slices.Contains(takes, arg) && known(arg) {
			return channelErr(PreconditionFailed, "PRECONDITION_FAILED - invalid arg '%s' for queue '%s' in vhost '/' of queue type rabbit_%s_queue", arg, name, kind)
		}
	}
	for _, arg := range sorted {
		if why := valueRefusal(arg, args[arg]); why != "" {
			return refuse(arg, why)
		}
	}
	if _, ok := args["x-dead-letter-routing-key"]; ok && args["x-dead-letter-exchange"] == nil {
		return refuse("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
	}
	return nil
}

// consumerArgs are the consumer arguments each version knows, and the queue types that take
// each: a queue of another type refuses it (one a version does not know is ignored).
var consumerArgs = map[bool]map[string][]string{ // by whether the version is 4.0 or later
	false: {"x-priority": {"classic", "quorum"}, "x-stream-offset": {"stream"}, "x-cancel-on-ha-failover": {"classic"}},
	true:  {"x-priority": {"classic", "quorum"}, "x-stream-offset": {"stream"}, "x-stream-filter": {"stream"}},
}

// consumerArgsRefusal is RabbitMQ's refusal of a consumer of q with args, or nil.
func (b *Broker) consumerArgsRefusal(q *queue, args Table) error {
	for _, arg := range slices.Sorted(maps.Keys(args)) {
		if types, ok := consumerArgs[b.atLeast(4, 0)][arg]; ok && !slices.Contains(types, q.kind()) {
			return channelErr(PreconditionFailed, "PRECONDITION_FAILED - invalid arg '%s' for queue '%s' in vhost '/' of queue type rabbit_%s_queue", arg, q.name, q.kind())
		}
	}
	return nil
}

// known reports whether some queue type takes arg.
func known(arg string) bool {
	for _, args := range queueArgs {
		if slices.Contains(args, arg) {
			return true
		}
	}
	return false
}

// valueRefusal is why RabbitMQ refuses v as the value of arg, as it prints it; "" if it does
// not.
func valueRefusal(arg string, v any) string {
	switch argKinds[arg] {
	case "string":
		if _, ok := v.(string); !ok {
			return unacceptable(v)
		}
		if valid, ok := argValues[arg]; ok && !slices.Contains(valid.values, v.(string)) {
			return strings.ReplaceAll(valid.refusal, "%s", v.(string))
		}
	case "bool":
		if _, ok := v.(bool); !ok {
			return unacceptable(v)
		}
	case "int":
		n, ok := intArg(v)
		if !ok {
			return fmt.Sprintf(`"expected integer, got %s"`, fieldType(v))
		}
		switch {
		case n < 0:
			return fmt.Sprintf("{value_negative,%d}", n)
		case n == 0 && (arg == "x-expires" || arg == "x-quorum-initial-group-size"):
			return "{value_zero,0}"
		case arg == "x-queue-version" && n != 1 && n != 2:
			return fmt.Sprintf(`"unsupported queue version '%d'"`, n)
		case n > maxExpiry && (arg == "x-message-ttl" || arg == "x-expires"):
			return fmt.Sprintf("{value_too_large,%d}", n)
		case n > 255 && arg == "x-max-priority":
			return fmt.Sprintf("{max_value_exceeded,%d}", n)
		}
	}
	return ""
}

// unacceptable is RabbitMQ's refusal of v's type.
func unacceptable(v any) string {
	return "{unacceptable_type," + fieldType(v) + "}"
}

// fieldType is RabbitMQ's name of v's AMQP field type.
func fieldType(v any) string {
	switch v.(type) {
	case string:
		return "longstr"
	case []byte:
		return "binary"
	case bool:
		return "bool"
	case int8:
		return "byte"
	case uint8:
		return "unsignedbyte"
	case int16:
		return "short"
	case uint16:
		return "unsignedshort"
	case int32:
		return "signedint"
	case uint32:
		return "unsignedint"
	case int64:
		return "long"
	case float32:
		return "float"
	case float64:
		return "double"
	case Decimal:
		return "decimal"
	case time.Time:
		return "timestamp"
	case Table:
		return "table"
	case []any:
		return "array"
	case nil:
		return "void"
	}
	return fmt.Sprintf("%T", v)
}

// expirationRefusal is RabbitMQ's refusal of a message's expiration property, which must be a
// whole number of milliseconds, not negative (a publish with another closes its channel; one
// of any size is taken), or nil. It reads the number as Erlang's string:to_integer does: a
// sign, digits, nothing after.
func expirationRefusal(exp string) error {
	if exp == "" {
		return nil // not set
	}
	sign := 0
	if exp[0] == '+' || exp[0] == '-' {
		sign = 1
	}
	end := sign
	for end < len(exp) && exp[end] >= '0' && exp[end] <= '9' {
		end++
	}
	// The number as Erlang prints it: no plus sign, no leading zeros.
	number := strings.TrimLeft(exp[sign:end], "0")
	if number == "" {
		number = "0"
	} else if exp[0] == '-' {
		number = "-" + number
	}
	why := ""
	switch {
	case end == sign:
		why = "no_integer"
	case end < len(exp):
		why = `{leftover_string,"` + exp[end:] + `"}`
	case number[0] == '-':
		why = "{value_negative," + number + "}"
	default:
		return nil
	}
	return channelErr(PreconditionFailed, "PRECONDITION_FAILED - invalid expiration '%s': %s", exp, why)
}

// headerRoutes returns the further routing keys in the CC and BCC headers of a message with
// properties p (sender-selected distribution: the strings of their arrays), and takes BCC out
// of its headers; a CC or BCC that is not an array is refused.
func headerRoutes(p *properties) ([]string, error) {
	var more []string
	for _, name := range []string{"CC", "BCC"} {
		v, ok := p.Headers[name]
		if !ok {
			continue
		}
		keys, ok := v.([]any)
		if !ok {
			return nil, channelErr(PreconditionFailed, `PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,"%s",%s}`, name, fieldType(v))
		}
		more = append(more, stringsIn(keys)...)
	}
	if _, ok := p.Headers["BCC"]; ok {
		p.Headers = maps.Clone(p.Headers)
		delete(p.Headers, "BCC")
	}
	return more, nil
}

// xMatchRefusal is a headers exchange's refusal of a binding's x-match, or nil.
func xMatchRefusal(args Table) error {
	v, ok := args["x-match"]
	if !ok {
		return nil
	}
	switch mode, ok := v.(string); {
	case !ok:
		return channelErr(PreconditionFailed, "PRECONDITION_FAILED - Invalid x-match field type %s (value %v); expected longstr", fieldType(v), v)
	case mode != "all" && mode != "any" && mode != "all-with-x" && mode != "any-with-x":
		return channelErr(PreconditionFailed, `PRECONDITION_FAILED - Invalid x-match field value <<"%s">>; expected all, any, all-with-x, or any-with-x`, mode)
	}
	return nil
}

// lockedErr is RabbitMQ's refusal of a queue another connection declared exclusive, or one
// redeclared with another exclusive property.
func lockedErr(queue string) error {
	return channelErr(ResourceLocked, "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '%s' in vhost '/'. "+
		"It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.", queue)
}

// queueInequivalence is RabbitMQ's refusal of a redeclaration m of q that differs from its
// declaration (checked in this order: exclusive, durable, auto-delete, then the arguments its
// type takes; others may differ), or nil.
func queueInequivalence(q *queue, m *queueDeclare) error {
	if (q.exclusive != nil) != m.Exclusive {
		return lockedErr(q.name)
	}
	what := "queue '" + q.name + "'"
	if err := fieldInequivalence(what, "durable", q.durable, m.Durable); err != nil {
		return err
	}
	if err := fieldInequivalence(what, "auto_delete", q.autoDelete, m.AutoDelete); err != nil {
		return err
	}
	for _, arg := range queueArgs[q.kind()] {
		was, now := q.args[arg], m.Arguments[arg]
		if arg == "x-queue-type" && was == nil && now == "classic" {
			continue // the default, said
		}
		if err := argInequivalence(what, arg, was, now); err != nil {
			return err
		}
	}
	return nil
}

// exchangeInequivalence is RabbitMQ's refusal of a redeclaration m of x that differs from its
// declaration (its type, durable, auto-delete, internal, its alternate exchange), or nil.
func exchangeInequivalence(x *exchange, m *exchangeDeclare) error {
	what := "exchange '" + x.name + "'"
	if x.kind != m.Type {
		return channelErr(PreconditionFailed, "PRECONDITION_FAILED - inequivalent arg 'type' for %s in vhost '/': received '%s' but current is '%s'", what, m.Type, x.kind)
	}
	for _, f := range []struct {
		name     string
		was, now bool
	}{{"durable", x.durable, m.Durable}, {"auto_delete", x.autoDelete, m.AutoDelete}, {"internal", x.internal, m.Internal}} {
		if err := fieldInequivalence(what, f.name, f.was, f.now); err != nil {
			return err
		}
	}
	return argInequivalence(what, "alternate-exchange", x.args["alternate-exchange"], m.Arguments["alternate-exchange"])
}

// fieldInequivalence refuses a redeclaration of what with another value of a property.
func fieldInequivalence(what, field string, was, now bool) error {
	if was == now {
		return nil
	}
	return channelErr(PreconditionFailed, "PRECONDITION_FAILED - inequivalent arg '%s' for %s in vhost '/': received '%t' but current is '%t'", field, what, now, was)
}

// argInequivalence refuses a redeclaration of what with another value of argument arg (nil:
// none); integers of any width are the same value.
func argInequivalence(what, arg string, was, now any) error {
	switch {
	case was == nil && now == nil:
		return nil
	case now == nil:
		return channelErr(PreconditionFailed, "PRECONDITION_FAILED - inequivalent arg '%s' for %s in vhost '/': received none but current is the value '%v' of type '%s'", arg, what, was, fieldType(was))
	case was == nil:
		return channelErr(PreconditionFailed, "PRECONDITION_FAILED - inequivalent arg '%s' for %s in vhost '/': received the value '%v' of type '%s' but current is none", arg, what, now, fieldType(now))
	}
	if sameArg(was, now) {
		return nil
	}
	return channelErr(PreconditionFailed, "PRECONDITION_FAILED - inequivalent arg '%s' for %s in vhost '/': received '%v' but current is '%v'", arg, what, now, was)
}
