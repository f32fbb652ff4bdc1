package warren

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
)

// MetadataOrderKey is a message's order key (see OrderBy), sent as a header of the same name.
// The message's own: it goes wherever the message goes, its retries included.
const MetadataOrderKey = "warren_order_key"

// ErrNoOrderKey is wrapped by the error of a message without an order key published to a
// queue ordered by key (topology.Queue.Lanes): it has no lane. Publishing again cannot cure
// it: Publish marks it Permanent.
var ErrNoOrderKey = errors.New("the queue is ordered by key and the message has no order key (warren.OrderBy)")

// OrderBy gives msg the order key key: a DLX publisher sends it to a queue ordered by key
// (topology.Queue.Lanes) through the lane of key, where the messages of one key are handled
// one at a time, in the order they were published (docs/ordering.md). A message of a queue
// that is not ordered carries the key along and is handled as any other.
func OrderBy(msg *message.Message, key string) { msg.Metadata.Set(MetadataOrderKey, key) }

// OrderKey is msg's order key, "" when it has none.
func OrderKey(msg *message.Message) string { return msg.Metadata.Get(MetadataOrderKey) }
