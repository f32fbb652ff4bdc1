package kill

import (
	"bytes"
	"encoding/json"
	"math"
	"time"
)

// MarshalJSON writes r with Waited as waited_ms, a number of milliseconds (fractional below
// a millisecond), as every duration in warren's JSON is.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result
	return marshal(struct {
		plain
		Waited float64 `json:"waited_ms"`
	}{plain(r), float64(r.Waited) / float64(time.Millisecond)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Result) UnmarshalJSON(data []byte) error {
	type plain Result
	v := struct {
		*plain
		Waited float64 `json:"waited_ms"`
	}{plain: (*plain)(r)}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	r.Waited = time.Duration(math.Round(v.Waited * float64(time.Millisecond)))
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
