package due

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// At reads every delay metadata form: warren's own first, then Watermill's.
func TestDue(t *testing.T) {
	// A time with a fraction of a second, as time.Now has: Watermill cuts it off.
	now := time.Date(2024, 5, 6, 7, 8, 9, 400_000_000, time.UTC)
	const tolerance = 5 * time.Second
	whole := func(t time.Time) string { return t.Format(time.RFC3339) } // as Watermill writes
	nano := func(t time.Time) string { return t.Format(time.RFC3339Nano) }

	for _, tc := range []struct {
		name    string
		md      message.Metadata
		want    time.Time // zero: at once
		wantErr string    // a substring of the error
	}{
		{name: "no delay", md: message.Metadata{"other": "x"}},

		{name: "delay", md: message.Metadata{warren.MetadataDelay: "1m30s"}, want: now.Add(90 * time.Second)},
		{name: "delay zero", md: message.Metadata{warren.MetadataDelay: "0s"}, want: now},
		{name: "delay negative", md: message.Metadata{warren.MetadataDelay: "-1s"}, wantErr: "delay -1s is negative"},
		{name: "delay garbage", md: message.Metadata{warren.MetadataDelay: "soon"}, wantErr: `metadata ` + warren.MetadataDelay + ` "soon" is not a duration`},
		{name: "delay before deliver-at and Watermill's", md: message.Metadata{
			warren.MetadataDelay: "2s", warren.MetadataDeliverAt: nano(now.Add(time.Hour)),
			delay.DelayedForKey: "1h", delay.DelayedUntilKey: whole(now.Add(time.Hour)),
		}, want: now.Add(2 * time.Second)},
		{name: "delay garbage not rescued by deliver-at", md: message.Metadata{
			warren.MetadataDelay: "soon", warren.MetadataDeliverAt: nano(now.Add(time.Hour)),
		}, wantErr: "is not a duration"},

		{name: "deliver-at", md: message.Metadata{warren.MetadataDeliverAt: nano(now.Add(1500 * time.Millisecond))}, want: now.Add(1500 * time.Millisecond)},
		{name: "deliver-at whole seconds, other zone", md: message.Metadata{warren.MetadataDeliverAt: "2024-05-06T09:08:30+02:00"}, want: time.Date(2024, 5, 6, 7, 8, 30, 0, time.UTC)},
		{name: "deliver-at before Watermill's", md: message.Metadata{
			warren.MetadataDeliverAt: nano(now.Add(time.Minute)), delay.DelayedForKey: "1h", delay.DelayedUntilKey: whole(now.Add(time.Hour)),
		}, want: now.Add(time.Minute)},
		{name: "deliver-at past within tolerance", md: message.Metadata{warren.MetadataDeliverAt: nano(now.Add(-3 * time.Second))}, want: now.Add(-3 * time.Second)},
		{name: "deliver-at past at tolerance", md: message.Metadata{warren.MetadataDeliverAt: nano(now.Add(-tolerance))}, want: now.Add(-tolerance)},
		{name: "deliver-at past beyond tolerance", md: message.Metadata{warren.MetadataDeliverAt: nano(now.Add(-tolerance - time.Millisecond))}, wantErr: "is 5.001s in the past (tolerance 5s)"},
		{name: "deliver-at garbage", md: message.Metadata{warren.MetadataDeliverAt: "tomorrow"}, wantErr: `metadata ` + warren.MetadataDeliverAt + ` "tomorrow" is not an RFC 3339 time`},
		{name: "deliver-at not RFC 3339", md: message.Metadata{warren.MetadataDeliverAt: now.Format(time.RFC1123)}, wantErr: "is not an RFC 3339 time"},

		{name: "watermill for", md: message.Metadata{delay.DelayedForKey: "30s"}, want: now.Add(30 * time.Second)},
		{name: "watermill for garbage", md: message.Metadata{delay.DelayedForKey: "30"}, wantErr: `metadata ` + delay.DelayedForKey + ` "30" is not a duration`},
		{name: "watermill for past within tolerance", md: message.Metadata{delay.DelayedForKey: "-2s"}, want: now},
		{name: "watermill for past beyond tolerance", md: message.Metadata{delay.DelayedForKey: "-6s"}, wantErr: "delay -6s (" + delay.DelayedForKey + ") is in the past (tolerance 5s)"},

		{name: "watermill until alone", md: message.Metadata{delay.DelayedUntilKey: whole(now.Add(time.Minute))}, want: now.Add(time.Minute).Truncate(time.Second)},
		// Alone, a past until is not checked against the tolerance (the publisher sends the
		// message at once), unlike DeliverAt.
		{name: "watermill until alone in the past", md: message.Metadata{delay.DelayedUntilKey: whole(now.Add(-time.Hour))}, want: now.Add(-time.Hour).Truncate(time.Second)},
		{name: "watermill until garbage", md: message.Metadata{delay.DelayedUntilKey: "later"}, wantErr: `metadata ` + delay.DelayedUntilKey + ` "later" is not an RFC 3339 time`},
		{name: "watermill until garbage with for", md: message.Metadata{delay.DelayedForKey: "1m", delay.DelayedUntilKey: "later"}, wantErr: "is not an RFC 3339 time"},
		{name: "watermill until with a fraction is exact", md: message.Metadata{
			delay.DelayedForKey: "1h", delay.DelayedUntilKey: nano(now.Add(time.Minute)),
		}, want: now.Add(time.Minute)},
		// delay.For(1m) right before Publish: until is now+1m with the fraction cut off, and
		// now+for is below until+1s.
		{name: "watermill for and until, as delay.For writes them", md: message.Metadata{
			delay.DelayedForKey: "1m0s", delay.DelayedUntilKey: whole(now.Add(time.Minute)),
		}, want: now.Add(time.Minute)},
		// The message waited since Watermill wrote until: now+for is later than until+1s.
		{name: "watermill for and until, published late", md: message.Metadata{
			delay.DelayedForKey: "1m0s", delay.DelayedUntilKey: whole(now.Add(30 * time.Second)),
		}, want: now.Add(30 * time.Second).Truncate(time.Second).Add(time.Second)},
		{name: "watermill until passed, published again", md: message.Metadata{
			delay.DelayedForKey: "1m0s", delay.DelayedUntilKey: whole(now.Add(-time.Second)),
		}},
		{name: "watermill until passed long ago, published again", md: message.Metadata{
			delay.DelayedForKey: "1m0s", delay.DelayedUntilKey: whole(now.Add(-24 * time.Hour)),
		}},
		{name: "watermill zero delay", md: message.Metadata{
			delay.DelayedForKey: "0s", delay.DelayedUntilKey: whole(now),
		}, want: now},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := message.NewMessage("id", nil)
			msg.Metadata = tc.md
			got, err := At(msg, now, tolerance)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.True(t, got.IsZero())
				return
			}
			require.NoError(t, err)
			assert.True(t, tc.want.Equal(got), "due %s, want %s", got, tc.want)
			assert.Equal(t, tc.want.IsZero(), got.IsZero())
		})
	}
}

// warren.Delay and warren.DeliverAt write what At reads, and each removes the other.
func TestDelayAndDeliverAtReadBackByDue(t *testing.T) {
	now := time.Date(2024, 5, 6, 7, 8, 9, 400_000_000, time.UTC)
	msg := message.NewMessage("id", nil)

	warren.DeliverAt(msg, now.Add(1234567*time.Microsecond).In(time.FixedZone("X", 3600)))
	got, err := At(msg, now, 0)
	require.NoError(t, err)
	assert.True(t, now.Add(1234567*time.Microsecond).Equal(got), "%s", got)

	warren.Delay(msg, 1500*time.Millisecond)
	assert.NotContains(t, msg.Metadata, warren.MetadataDeliverAt)
	got, err = At(msg, now, 0)
	require.NoError(t, err)
	assert.True(t, now.Add(1500*time.Millisecond).Equal(got), "%s", got)

	warren.DeliverAt(msg, now.Add(time.Minute))
	assert.NotContains(t, msg.Metadata, warren.MetadataDelay)
	got, err = At(msg, now, 0)
	require.NoError(t, err)
	assert.True(t, now.Add(time.Minute).Equal(got), "%s", got)
}
