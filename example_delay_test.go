package warren_test

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
)

// A message delayed by 90 seconds: the DLX publisher (dlx.Publisher, or the outbox's relay)
// reads the metadata Delay writes, consumes it, and sends the message through the delay
// levels.
func ExampleDelay() {
	msg := message.NewMessage("order-42", []byte(`{"id":42}`))
	warren.Delay(msg, 90*time.Second)
	fmt.Println(msg.Metadata.Get(warren.MetadataDelay))
	// Output: 1m30s
}

// A message delivered at a time, in UTC whatever the zone of t. DeliverAt drops a delay set
// before, and Delay drops a time.
func ExampleDeliverAt() {
	msg := message.NewMessage("renewal-7", nil)
	warren.Delay(msg, time.Hour)
	warren.DeliverAt(msg, time.Date(2030, 1, 2, 9, 0, 0, 0, time.FixedZone("CET", 3600)))
	fmt.Println(msg.Metadata.Get(warren.MetadataDeliverAt), msg.Metadata.Get(warren.MetadataDelay) == "")
	// Output: 2030-01-02T08:00:00Z true
}

// A delayed message scheduled under its UUID: ledger.Ledger lists it and can cancel it
// until it is delivered.
func ExampleSchedule() {
	msg := message.NewMessage("renewal-7", nil)
	warren.Delay(msg, 30*24*time.Hour)
	id := warren.Schedule(msg, "")
	fmt.Println(id)
	// Output: renewal-7
}
