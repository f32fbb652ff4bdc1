// Package msjson writes warren's JSON as the CLI prints it: durations as numbers of
// milliseconds (in keys ending _ms), and no HTML escaping.
package msjson

import (
	"bytes"
	"encoding/json"
	"math"
	"time"
)

// Millis is d in milliseconds, fractional below a millisecond.
func Millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Duration is the duration of ms milliseconds, rounded to the nanosecond: Millis read back.
func Duration(ms float64) time.Duration {
	return time.Duration(math.Round(ms * float64(time.Millisecond)))
}

// Marshal is json.Marshal without HTML escaping: "<" stays "<".
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
