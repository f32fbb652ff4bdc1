// Package due reads when a message is to be delivered from its delay metadata (warren.Delay,
// warren.DeliverAt, or Watermill's components/delay keys), as the DLX publisher and the
// outbox plan it. It is not part of warren's API: users call dlx.Due.
package due

import (
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
)

// DefaultPastTolerance is how far in the past a DeliverAt time may lie, by default, before it
// is an error (dlx.DefaultPastTolerance, and the outbox's default).
const DefaultPastTolerance = time.Second

// At returns when msg is to be delivered, relative to now (the time Publish was called);
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
func At(msg *message.Message, now time.Time, tolerance time.Duration) (time.Time, error) {
	if s := msg.Metadata.Get(warren.MetadataDelay); s != "" {
		return delayed(s, now)
	}
	if s := msg.Metadata.Get(warren.MetadataDeliverAt); s != "" {
		return deliverAt(s, now, tolerance)
	}
	return watermill(msg.Metadata.Get(delay.DelayedForKey), msg.Metadata.Get(delay.DelayedUntilKey), now, tolerance)
}

// delayed reads s, the value of warren.MetadataDelay: a duration from now, not negative.
func delayed(s string, now time.Time) (time.Time, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("dlx: metadata %s %q is not a duration: %w", warren.MetadataDelay, s, err)
	}
	if d < 0 {
		return time.Time{}, fmt.Errorf("dlx: delay %s is negative", d)
	}
	return now.Add(d), nil
}

// deliverAt reads s, the value of warren.MetadataDeliverAt: an RFC 3339 time, at most
// tolerance before now.
func deliverAt(s string, now time.Time, tolerance time.Duration) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("dlx: metadata %s %q is not an RFC 3339 time: %w", warren.MetadataDeliverAt, s, err)
	}
	if t.Before(now.Add(-tolerance)) {
		return time.Time{}, fmt.Errorf("dlx: delivery time %s is %s in the past (tolerance %s)", s, now.Sub(t).Round(time.Millisecond), tolerance)
	}
	return t, nil
}

// watermill reads Watermill's components/delay metadata, forStr and untilStr (either may be
// ""), as At describes.
func watermill(forStr, untilStr string, now time.Time, tolerance time.Duration) (time.Time, error) {
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
