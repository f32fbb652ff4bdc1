package ledger

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/warrenmq/warren/internal/msjson"
)

// Entry is a message that waits: scheduled, neither cancelled nor delivered yet.
type Entry struct {
	// ID is the schedule id, byte for byte as the message carries it. In JSON it is id, and
	// also id_base64 (its bytes in standard base64) when it is not valid UTF-8 or holds
	// U+FFFD, which a JSON string cannot keep apart: UnmarshalJSON takes id_base64 when
	// present.
	ID string `json:"id"`
	// Exchange and Queue: where it goes (Queue when published to a queue).
	Exchange   string `json:"exchange,omitempty"`
	Queue      string `json:"queue,omitempty"`
	RoutingKey string `json:"routing_key,omitempty"`
	// Due is when it is due; Scheduled when it was published.
	Due       time.Time `json:"due"`
	Scheduled time.Time `json:"scheduled"`
}

// MarshalJSON writes e with id_base64 beside id when JSON cannot hold the id exactly (see
// Entry.ID).
func (e Entry) MarshalJSON() ([]byte, error) {
	type plain Entry
	return msjson.Marshal(struct {
		plain
		IDBase64 string `json:"id_base64,omitempty"`
	}{plain(e), idBase64(e.ID)})
}

// UnmarshalJSON reads what MarshalJSON writes: the id is id_base64 when present, else id.
func (e *Entry) UnmarshalJSON(data []byte) error {
	type plain Entry
	v := struct {
		*plain
		IDBase64 string `json:"id_base64"`
	}{plain: (*plain)(e)}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	if v.IDBase64 != "" {
		id, err := base64.StdEncoding.DecodeString(v.IDBase64)
		if err != nil {
			return fmt.Errorf("ledger: entry id_base64: %w", err)
		}
		e.ID = string(id)
	}
	return nil
}

// Destination is the queue, or the exchange, of e.
func (e Entry) Destination() string {
	if e.Queue != "" {
		return e.Queue
	}
	return e.Exchange
}
