package ops

import (
	"bytes"
	"encoding/json"
	"math"
	"time"
)

// MarshalJSON writes l with TTL as ttl_ms, a number of milliseconds, as every duration in
// warren's JSON is.
func (l LevelStatus) MarshalJSON() ([]byte, error) {
	type plain LevelStatus
	return marshal(struct {
		plain
		TTL float64 `json:"ttl_ms"`
	}{plain(l), float64(l.TTL) / float64(time.Millisecond)})
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
	l.TTL = time.Duration(math.Round(v.TTL * float64(time.Millisecond)))
	return nil
}

// marshal is json.Marshal without HTML escaping: "<" stays "<", as the CLI prints JSON.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
