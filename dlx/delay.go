package dlx

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
)

// ErrInvalidDelay is wrapped by the error of a message whose delay metadata cannot be
// planned: not a duration or time, negative, too far in the past, or above the maximum of the
// delay levels.
var ErrInvalidDelay = errors.New("invalid delay")

// Delay asks for msg to be delivered d after it is published. d is rounded up to the unit
// of the delay levels: a message is never delivered early.
func Delay(msg *message.Message, d time.Duration) {
	msg.Metadata.Set(warren.MetadataDelay, d.String())
	delete(msg.Metadata, warren.MetadataDeliverAt)
}

// DeliverAt asks for msg to be delivered at t (rounded up to the unit of the delay levels).
func DeliverAt(msg *message.Message, t time.Time) {
	msg.Metadata.Set(warren.MetadataDeliverAt, t.UTC().Format(time.RFC3339Nano))
	delete(msg.Metadata, warren.MetadataDelay)
}

// Due returns when msg is to be delivered if it is published at now, as Publish reads its
// delay metadata (Delay, DeliverAt, or Watermill's components/delay keys): the zero time
// means at once. It fails as Publish would, on a value that is not a delay, a negative delay
// or a DeliverAt further than tolerance in the past. (A delay beyond the levels' reach is
// known only to a Publisher.)
func Due(msg *message.Message, now time.Time, tolerance time.Duration) (time.Time, error) {
	return due(msg, now, tolerance)
}

// due returns when msg is to be delivered, relative to now (the time Publish was called);
// the zero time means at once. Errors name the offending value.
//
// warren's own metadata (Delay, DeliverAt) comes first. Otherwise Watermill's
// components/delay metadata is honoured: _watermill_delayed_for (a duration) and
// _watermill_delayed_until (RFC 3339, which Watermill writes in whole seconds, cutting the
// fraction off). Both together, with a whole-second until, mean a due time in
// [until, until+1s): warren delivers at min(until+1s, now+for), which is never early and,
// for a message published right after delay.For or delay.Until, as good as exact. A message
// whose until has fully passed was delayed before and is now published again (a handler
// forwarding what it received): it is sent at once.
func due(msg *message.Message, now time.Time, tolerance time.Duration) (time.Time, error) {
	if s := msg.Metadata.Get(warren.MetadataDelay); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return time.Time{}, fmt.Errorf("dlx: metadata %s %q is not a duration: %w", warren.MetadataDelay, s, err)
		}
		if d < 0 {
			return time.Time{}, fmt.Errorf("dlx: delay %s is negative", d)
		}
		return now.Add(d), nil
	}
	if s := msg.Metadata.Get(warren.MetadataDeliverAt); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return time.Time{}, fmt.Errorf("dlx: metadata %s %q is not an RFC 3339 time: %w", warren.MetadataDeliverAt, s, err)
		}
		if t.Before(now.Add(-tolerance)) {
			return time.Time{}, fmt.Errorf("dlx: delivery time %s is %s in the past (tolerance %s)", s, now.Sub(t).Round(time.Millisecond), tolerance)
		}
		return t, nil
	}

	forStr, untilStr := msg.Metadata.Get(delay.DelayedForKey), msg.Metadata.Get(delay.DelayedUntilKey)
	var (
		forD   time.Duration
		hasFor bool
	)
	if forStr != "" {
		d, err := time.ParseDuration(forStr)
		if err != nil {
			return time.Time{}, fmt.Errorf("dlx: metadata %s %q is not a duration: %w", delay.DelayedForKey, forStr, err)
		}
		if d < -tolerance {
			return time.Time{}, fmt.Errorf("dlx: delay %s (%s) is in the past (tolerance %s)", d, delay.DelayedForKey, tolerance)
		}
		forD, hasFor = max(d, 0), true
	}
	if untilStr == "" {
		if hasFor {
			return now.Add(forD), nil
		}
		return time.Time{}, nil
	}
	until, err := time.Parse(time.RFC3339Nano, untilStr)
	if err != nil {
		return time.Time{}, fmt.Errorf("dlx: metadata %s %q is not an RFC 3339 time: %w", delay.DelayedUntilKey, untilStr, err)
	}
	if !hasFor || strings.Contains(untilStr, ".") {
		return until, nil // exact
	}
	latest := until.Add(time.Second) // the fraction Watermill cut off is below one second
	if !now.Before(latest) {
		return time.Time{}, nil // delayed before; published again
	}
	if t := now.Add(forD); t.Before(latest) {
		return t, nil
	}
	return latest, nil
}

// sentMetadata reports whether a metadata key is sent on as a header.
func sentMetadata(key string) bool {
	return key != warren.MetadataDelay && key != warren.MetadataDeliverAt && key != warren.MetadataPublishID
}
