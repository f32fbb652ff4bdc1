package ops

import (
	"encoding/json"

	"github.com/warrenmq/warren/internal/msjson"
)

// MarshalJSON writes l with TTL as ttl_ms, a number of milliseconds, as every duration in
// warren's JSON is.
func (l LevelStatus) MarshalJSON() ([]byte, error) {
	type plain LevelStatus
	return msjson.Marshal(struct {
		plain
		TTL float64 `json:"ttl_ms"`
	}{plain(l), msjson.Millis(l.TTL)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (l *LevelStatus) UnmarshalJSON(data []byte) error {
	type plain LevelStatus
	v := struct {
		*plain
		TTL float64 `json:"ttl_ms"`
	}{plain: (*plain)(l)}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	l.TTL = msjson.Duration(v.TTL)
	return nil
}
