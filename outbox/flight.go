package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"

	"github.com/warrenmq/warren"
)

// flight is a batch of rows being published, and, once done is closed, what became of them.
type flight struct {
	rows []row
	done chan struct{}

	confirmed []row      // the rows the broker confirmed
	at        time.Time  // when it confirmed the last of them
	aside     []setAside // the rows the broker will never take
	err       error      // a failure that publishing again may cure: the rows after it wait
}

// setAside is a row to set aside and the reason.
type setAside struct {
	id     int64
	reason error
}

func (f *flight) ids() []int64 {
	ids := make([]int64, len(f.confirmed))
	for i, w := range f.confirmed {
		ids[i] = w.id
	}
	return ids
}

func (f *flight) written() []time.Time {
	t := make([]time.Time, len(f.confirmed))
	for i, w := range f.confirmed {
		t[i] = w.written
	}
	return t
}

// fly publishes batch in the background, in order, a run of rows to one topic per Publish
// call; a failure that publishing again may cure ends it, so that nothing overtakes the
// failed rows.
func (r *Relay) fly(ctx context.Context, batch []row) *flight {
	f := &flight{rows: batch, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for start := 0; start < len(batch) && f.err == nil; {
			end := start + 1
			for end < len(batch) && string(batch[end].topic) == string(batch[start].topic) {
				end++
			}
			r.publish(ctx, f, batch[start:end])
			start = end
		}
		f.at = time.Now()
	}()
	return f
}

// publish publishes rows (all to one topic) in one call, and notes in f those the broker
// confirmed. When the call fails with a permanent error, it publishes them one at a time
// (the ones confirmed before go again, with their publish ids) and notes each row that fails
// so to be set aside.
func (r *Relay) publish(ctx context.Context, f *flight, rows []row) {
	topic := string(rows[0].topic)
	var msgs []*message.Message
	var keep []row
	now := time.Now()
	for _, w := range rows {
		msg, err := r.message(ctx, w, now)
		if err != nil {
			f.aside = append(f.aside, setAside{w.id, err})
			continue
		}
		msgs, keep = append(msgs, msg), append(keep, w)
	}
	if len(msgs) == 0 {
		return
	}
	err := r.cfg.Publisher.Publish(topic, msgs...)
	switch {
	case err == nil:
		f.confirmed = append(f.confirmed, keep...)
		return
	case !warren.IsPermanent(err):
		f.err = fmt.Errorf("publish %d message(s) to %q: %w", len(msgs), topic, err)
		return
	case len(msgs) == 1:
		f.aside = append(f.aside, setAside{keep[0].id, err})
		return
	}
	for i, msg := range msgs {
		err := r.cfg.Publisher.Publish(topic, msg)
		switch {
		case err == nil:
			f.confirmed = append(f.confirmed, keep[i])
		case warren.IsPermanent(err):
			f.aside = append(f.aside, setAside{keep[i].id, err})
		default:
			f.err = fmt.Errorf("publish a message to %q: %w", topic, err)
			return
		}
	}
}

// message makes the Watermill message of w, due when w says (at once if that has passed),
// with its publish id and the trace context of the transaction that wrote it.
func (r *Relay) message(ctx context.Context, w row, now time.Time) (*message.Message, error) {
	md, err := decodeMetadata(w.metadata)
	if err != nil {
		return nil, err
	}
	md[warren.MetadataPublishID] = w.publishID
	if w.due != nil && w.due.After(now) {
		md[warren.MetadataDeliverAt] = w.due.UTC().Format(time.RFC3339Nano)
	}
	msg := message.NewMessage(string(w.uuid), w.payload)
	msg.Metadata = md
	// The relay's context: a relay that stops ends its publish, and the rows wait for the next.
	msg.SetContext(r.cfg.Propagator.Extract(ctx, propagation.MapCarrier(md)))
	return msg, nil
}
