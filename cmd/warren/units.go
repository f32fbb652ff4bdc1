package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
)

// human is how the CLI shows a duration to a person. From a minute up: days, hours, minutes
// and seconds, each only when not zero, truncated to the second (49d17h2m47s, 2h, 1d5m), so
// that a maximum is never shown larger than it is. Below a minute, Go's form truncated to the
// millisecond (5.019s), below a second to the microsecond (1.5ms, 250µs); zero is 0s.
func human(d time.Duration) string {
	switch {
	case d == math.MinInt64:
		d++ // -d would overflow
		fallthrough
	case d < 0:
		return "-" + human(-d)
	case d < time.Second:
		return d.Truncate(time.Microsecond).String()
	case d < time.Minute:
		return d.Truncate(time.Millisecond).String()
	}
	var sb strings.Builder
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if n := d / u.unit; n > 0 {
			fmt.Fprintf(&sb, "%d%s", n, u.name)
			d -= n * u.unit
		}
	}
	return sb.String()
}

// joinJSON is one JSON object with the fields of a and then those of b, each of which
// marshals to an object: b adds fields to a type whose MarshalJSON (kill.Result's, which
// writes durations in milliseconds) embedding it would hide them from.
func joinJSON(a, b any) (json.RawMessage, error) {
	marshal := func(v any) ([]byte, error) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		err := enc.Encode(v)
		return bytes.TrimSpace(buf.Bytes()), err
	}
	ja, err := marshal(a)
	if err != nil {
		return nil, err
	}
	jb, err := marshal(b)
	if err != nil {
		return nil, err
	}
	ja, jb = bytes.TrimSuffix(ja, []byte("}")), bytes.TrimPrefix(jb, []byte("{"))
	if len(ja) > 1 && len(jb) > 1 {
		ja = append(ja, ',')
	}
	return append(ja, jb...), nil
}
