package dlx

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/due"
)

// Due returns when msg is to be delivered if it is published at now, as Publish reads its
// delay metadata (warren.Delay, warren.DeliverAt, or Watermill's components/delay keys): the
// zero time means at once. It fails as Publish would, on a value that is not a delay, a
// negative delay or a DeliverAt further than tolerance in the past. (A delay beyond the
// levels' reach is known only to a Publisher.)
func Due(msg *message.Message, now time.Time, tolerance time.Duration) (time.Time, error) {
	return due.At(msg, now, tolerance)
}

// sentMetadata reports whether a metadata key is sent on as a header: the instructions to the
// publisher (a delay, a delivery time, a publish id) are consumed by Publish.
func sentMetadata(key string) bool {
	return key != warren.MetadataDelay && key != warren.MetadataDeliverAt && key != warren.MetadataPublishID
}
