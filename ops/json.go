package ops

import (
	"encoding/json"

	"github.com/warrenmq/warren/internal/msjson"
)

// MarshalJSON writes l with TTL and DueWithin as ttl_ms and due_within_ms, numbers of
// milliseconds, as every duration in warren's JSON is.
func (l LevelStatus) MarshalJSON() ([]byte, error) {
	type plain LevelStatus
	return msjson.Marshal(struct {
		plain
		TTL       float64 `json:"ttl_ms"`
		DueWithin float64 `json:"due_within_ms"`
	}{plain(l), msjson.Millis(l.TTL), msjson.Millis(l.DueWithin)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (l *LevelStatus) UnmarshalJSON(data []byte) error {
	type plain LevelStatus
	v := struct {
		*plain
		TTL       float64 `json:"ttl_ms"`
		DueWithin float64 `json:"due_within_ms"`
	}{plain: (*plain)(l)}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	l.TTL, l.DueWithin = msjson.Duration(v.TTL), msjson.Duration(v.DueWithin)
	return nil
}
