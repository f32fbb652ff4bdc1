package warren

import (
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// This file is the delay half of the message contract: the setters that ask a DLX publisher
// (dlx.Publisher, and the outbox that publishes through one) to deliver a message later, and
// the errors its Publish wraps when a message cannot be sent as asked. The setters only write
// metadata (MetadataDelay, MetadataDeliverAt, MetadataScheduleID); the publisher reads and
// consumes it.

// ErrInvalidDelay is wrapped by the error of a message whose delay metadata cannot be
// planned: not a duration or time, negative, too far in the past, or above the maximum of the
// delay levels. Publishing again cannot cure it: Publish marks it Permanent.
var ErrInvalidDelay = errors.New("invalid delay")

// ErrTooLarge is wrapped by the error of a message whose properties (headers included) do
// not fit in one frame, with room left for the headers the broker adds on its way (x-death
// on every delay hop, the quorum delivery count). The publisher refuses it before anything is
// sent: RabbitMQ would close the whole connection, failing every message in flight on it.
var ErrTooLarge = errors.New("the message's properties and headers are too large for a frame")

// Delay asks for msg to be delivered d after it is published, and drops a time set by
// DeliverAt. d is rounded up to the unit of the delay levels: a message is never delivered
// early. Delay(msg, 0) asks for no delay, and outranks Watermill's components/delay metadata.
func Delay(msg *message.Message, d time.Duration) {
	msg.Metadata.Set(MetadataDelay, d.String())
	delete(msg.Metadata, MetadataDeliverAt)
}

// DeliverAt asks for msg to be delivered at t (rounded up to the unit of the delay levels),
// and drops a delay set by Delay. A t in the past is delivered at once, up to the publisher's
// past tolerance (dlx.Config.PastTolerance); further in the past it is ErrInvalidDelay.
func DeliverAt(msg *message.Message, t time.Time) {
	msg.Metadata.Set(MetadataDeliverAt, t.UTC().Format(time.RFC3339Nano))
	delete(msg.Metadata, MetadataDelay)
}

// Schedule makes msg, delayed with Delay or DeliverAt, listable and cancellable under id
// (msg.UUID when id is ""), and returns the id: the DLX publisher records it in the ledger of
// the delay levels before it publishes the message, and ledger.Ledger lists and cancels it
// (see package ledger). A message published without a delay is not recorded.
func Schedule(msg *message.Message, id string) string {
	if id == "" {
		id = msg.UUID
	}
	msg.Metadata.Set(MetadataScheduleID, id)
	return id
}
