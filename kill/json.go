package kill

import (
	"encoding/json"

	"github.com/warrenmq/warren/internal/msjson"
)

// MarshalJSON writes r with Waited as waited_ms, a number of milliseconds (fractional below
// a millisecond), as every duration in warren's JSON is.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result
	return msjson.Marshal(struct {
		plain
		Waited float64 `json:"waited_ms"`
	}{plain(r), msjson.Millis(r.Waited)})
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
	r.Waited = msjson.Duration(v.Waited)
	return nil
}
