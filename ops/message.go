package ops

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
)

// Message is a message of a poison or parking queue, as Poisoned and Parked read it.
type Message struct {
	// Position in the queue: 1 is the head, the next to be delivered.
	Position int `json:"position"`
	// ID is the message id (Watermill's UUID): the AMQP message-id, or the header that
	// carries an id too long for it (see contract.DeliveryID).
	ID string `json:"id"`
	// Reason says why it is there: a warren.PoisonReason* for a poison message;
	// ParkedReasonGone or ParkedReasonUnroutable for a parked one.
	Reason string `json:"reason"`
	// Error, ErrorType and Handler: the failure, from the poison record (warren.PoisonRecord).
	Error     string `json:"error,omitempty"`
	ErrorType string `json:"error_type,omitempty"`
	Handler   string `json:"handler,omitempty"`
	// Destination is where a replay sends it by default: the work queue it failed in, or the
	// destination of a delayed message ("exchange NAME" for an exchange).
	Destination string `json:"destination"`
	// Attempts is the number of attempts made.
	Attempts     int       `json:"attempts,omitempty"`
	FirstFailure time.Time `json:"first_failure,omitzero"`
	LastFailure  time.Time `json:"last_failure,omitzero"`
	TraceID      string    `json:"trace_id,omitempty"`
	// Group identifies the failures of the same kind (see Group).
	Group string `json:"group,omitempty"`
	// Headers are all of its headers, as strings (tables and arrays as JSON).
	Headers     map[string]string `json:"headers"`
	ContentType string            `json:"content_type,omitempty"`
	// Body is set when the browse asked for bodies.
	Body []byte `json:"body,omitempty"`
	// Unreadable is set for a message whose headers the client library could not parse: the
	// broker's headers are not available, and a replay leaves it where it is.
	Unreadable bool `json:"unreadable,omitempty"`
}

// Reasons of parked messages.
const (
	// ParkedReasonGone: the destination of a delayed message did not exist when it was due.
	ParkedReasonGone = "destination gone"
	// ParkedReasonUnroutable: a level exchange could not route it (a foreign message, or a
	// missing or bad delay digit).
	ParkedReasonUnroutable = "not routable by the delay levels"
)

// fromDelivery reads d, the message at position pos; queue is the work queue of a poison
// queue, "" for the parking queue.
func fromDelivery(pos int, d amqp.Delivery, queue string, withBody bool) Message {
	m := Message{Position: pos, ID: contract.DeliveryID(d), ContentType: d.ContentType, Headers: make(map[string]string, len(d.Headers))}
	for k, v := range d.Headers {
		m.Headers[k] = contract.HeaderString(v)
	}
	if withBody {
		m.Body = d.Body
	}
	_, m.Unreadable = d.Headers[contract.UnreadableHeader]
	h := m.Headers
	if queue == "" {
		switch {
		case h[contract.DestQueueHeader] != "":
			m.Destination, m.Reason = h[contract.DestQueueHeader], ParkedReasonGone
		case h[contract.DestExchangeHeader] != "":
			m.Destination, m.Reason = "exchange "+h[contract.DestExchangeHeader], ParkedReasonGone
		default:
			m.Reason = ParkedReasonUnroutable
		}
		return m
	}
	record := warren.DecodePoisonRecord(h)
	m.Reason, m.Error, m.ErrorType, m.Handler = record.Reason, record.Error, record.ErrorType, record.Handler
	m.Destination = queue
	m.Attempts, m.FirstFailure, m.LastFailure, m.TraceID = record.Attempts, record.FirstFailure, record.LastFailure, record.TraceID
	m.Group = groupID(m.Handler, m.ErrorType, Normalize(m.Error))
	if m.Reason == "" && m.Unreadable {
		m.Reason = warren.PoisonReasonUnreadable
	}
	return m
}

// Filter selects messages; its zero value selects all. The conditions that are set must
// all hold.
type Filter struct {
	// IDs: the message id is one of them.
	IDs []string
	// Group: the message is of this group (Message.Group, as Group lists them).
	Group string
	// Error: the error text matches this regular expression.
	Error *regexp.Regexp
	// Handler: the handler's name is this.
	Handler string
	// Reason: the reason is this.
	Reason string
	// Since and Until: the last failure is within [Since, Until).
	Since, Until time.Time
	// Headers: the message has each of these headers with this value.
	Headers map[string]string
	// Redact, if set, is applied to a copy of each message before the conditions are
	// checked (see Redacted), so that the filter selects by what a reader who sees redacted
	// messages alone sees: a header that Redact blanks matches its blanked value only. What
	// is replayed or deleted is the message itself, not the copy. Redact must be safe for
	// concurrent use; it is given no body in a delete or a replay.
	Redact func(*Message)
}

// Match reports whether m is selected.
func (f Filter) Match(m Message) bool {
	if f.Redact != nil {
		m = Redacted(m, f.Redact)
	}
	switch {
	case len(f.IDs) > 0 && !slices.Contains(f.IDs, m.ID),
		f.Group != "" && m.Group != f.Group,
		f.Error != nil && !f.Error.MatchString(m.Error),
		f.Handler != "" && m.Handler != f.Handler,
		f.Reason != "" && m.Reason != f.Reason,
		!f.Since.IsZero() && m.LastFailure.Before(f.Since),
		!f.Until.IsZero() && !m.LastFailure.Before(f.Until):
		return false
	}
	for k, v := range f.Headers {
		if got, ok := m.Headers[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Redacted returns a copy of m that redact has changed, m itself left as it is: the copy's
// Headers and Body are copies too. The Group of a poison message is then computed again from
// the Handler, ErrorType and Error that redact left, as Group computes a group's ID, so that
// the groups of redacted messages and a Filter on their Group agree.
func Redacted(m Message, redact func(*Message)) Message {
	grouped := m.Group != "" // a poison message; a parked one has no group
	m.Headers, m.Body = maps.Clone(m.Headers), bytes.Clone(m.Body)
	redact(&m)
	if grouped {
		m.Group = groupID(m.Handler, m.ErrorType, Normalize(m.Error))
	}
	return m
}

// FailureGroup is the failures of one kind: the same handler, error type and normalised
// error.
type FailureGroup struct {
	ID        string `json:"id"`
	Handler   string `json:"handler"`
	ErrorType string `json:"error_type"`
	// Error is the normalised error text (see Normalize).
	Error string `json:"error"`
	Count int    `json:"count"`
	// First and Last are the earliest and latest last failure of its messages.
	First time.Time `json:"first,omitzero"`
	Last  time.Time `json:"last,omitzero"`
	// Example is the id of its first message in the queue.
	Example string `json:"example"`
}

// Group sorts msgs into failure groups, the largest first (then in queue order).
func Group(msgs []Message) []FailureGroup {
	var groups []FailureGroup
	index := map[string]int{}
	for _, m := range msgs {
		norm := Normalize(m.Error)
		id := groupID(m.Handler, m.ErrorType, norm)
		i, ok := index[id]
		if !ok {
			i = len(groups)
			index[id] = i
			groups = append(groups, FailureGroup{ID: id, Handler: m.Handler, ErrorType: m.ErrorType,
				Error: norm, First: m.LastFailure, Last: m.LastFailure, Example: m.ID})
		}
		g := &groups[i]
		g.Count++
		if m.LastFailure.Before(g.First) {
			g.First = m.LastFailure
		}
		if m.LastFailure.After(g.Last) {
			g.Last = m.LastFailure
		}
	}
	slices.SortStableFunc(groups, func(a, b FailureGroup) int { return b.Count - a.Count })
	return groups
}

var normalizers = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'[^']*'`), "<str>"},
	{regexp.MustCompile(`\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b`), "<uuid>"},
	{regexp.MustCompile(`\b\d{4}-\d\d-\d\d[T ][0-9:.]+(?:Z|[+-]\d\d:?\d\d)?`), "<time>"},
	{regexp.MustCompile(`\b(?:0x[0-9a-fA-F]+|[0-9a-fA-F]{8,})\b`), "<hex>"},
	{regexp.MustCompile(`\d+(?:\.\d+)?`), "<n>"},
}

// Normalize replaces the parts of an error text that differ from one message to the next
// (quoted strings, UUIDs, times, hexadecimal ids and numbers) with placeholders, so that
// failures of the same kind have the same text: `order 42: "x" not found` and `order 7: "y"
// not found` are both `order <n>: <str> not found`.
func Normalize(err string) string {
	for _, n := range normalizers {
		err = n.re.ReplaceAllString(err, n.with)
	}
	return err
}

func groupID(handler, errorType, normalized string) string {
	sum := sha256.Sum256([]byte(handler + "\x00" + errorType + "\x00" + normalized))
	return hex.EncodeToString(sum[:4])
}

// replayHeaders are the headers of the copy of d a replay publishes, and its expiration
// property: d's headers without the bookkeeping of its deliveries (warren.IsBookkeeping:
// a replay is a new hop and starts a fresh round of attempts) or a delay instruction, with
// warren.ReplaysKey counted up. The expiration is d's, else the one its poison record kept
// (warren.PoisonRecord.Expiration), which goes back to the header warren.MetadataExpiration
// if RabbitMQ would refuse it as the property. A user-id property (of a message the broker
// dead-lettered) becomes the header warren.MetadataUserID: the broker refuses a publish with
// another user's id.
func replayHeaders(d amqp.Delivery) (amqp.Table, string) {
	h := d.Headers
	out := make(amqp.Table, len(h)+2)
	for k, v := range h {
		if warren.IsBookkeeping(k) || warren.IsDelayMetadata(k) {
			continue
		}
		out[k] = v
	}
	n, _ := strconv.Atoi(contract.HeaderString(h[warren.ReplaysKey]))
	out[warren.ReplaysKey] = strconv.Itoa(n + 1)
	keepUserID(out, d)
	expiration := d.Expiration
	if kept := warren.DecodePoisonTable(h).Expiration; expiration == "" && kept != "" {
		if contract.ValidExpiration(kept) {
			expiration = kept
		} else {
			out[warren.MetadataExpiration] = kept
		}
	}
	return out, expiration
}

// keepUserID sets the header warren.MetadataUserID of h to d's user-id property, unless h has
// it already (the property is never published again: see warren.Marshaler).
func keepUserID(h amqp.Table, d amqp.Delivery) {
	if _, ok := h[warren.MetadataUserID]; !ok && d.UserId != "" {
		h[warren.MetadataUserID] = d.UserId
	}
}
