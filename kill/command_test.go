package kill

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Verify accepts a command for this queue, correctly signed when there is a secret, dated
// within maxAge behind and skew ahead of the consumer's clock, and refuses anything else.
func TestCommandVerify(t *testing.T) {
	secret := []byte("s3cret")
	now := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	const maxAge, skew = time.Minute, 5 * time.Second
	signed := func(c Command) Command { c.Sign(secret); return c }
	cmd := Command{Queue: "orders", Action: Stop, At: now.Add(-time.Second)}

	for _, tc := range []struct {
		name    string
		cmd     Command
		queue   string
		secret  []byte
		maxAge  time.Duration
		wantErr string // a substring of the error; "" for none
	}{
		{name: "signed", cmd: signed(cmd)},
		{name: "signed delete", cmd: signed(Command{Queue: "orders", Action: Delete, At: now})},
		{name: "signed resume", cmd: signed(Command{Queue: "orders", Action: Resume, At: now})},
		{name: "unsigned without a secret", cmd: cmd, secret: []byte{}},
		{name: "signed without a secret", cmd: signed(cmd), secret: []byte{}},
		{name: "another queue", cmd: signed(Command{Queue: "payments", Action: Stop, At: now}), wantErr: `command for queue "payments", not "orders"`},
		{name: "another queue without a secret", cmd: Command{Queue: "payments", Action: Stop, At: now}, secret: []byte{}, wantErr: "not \"orders\""},
		{name: "unknown action", cmd: signed(Command{Queue: "orders", Action: "pause", At: now}), wantErr: `unknown action "pause"`},
		{name: "unsigned with a secret", cmd: cmd, wantErr: "unsigned command"},
		{name: "signed with another secret", cmd: func() Command { c := cmd; c.Sign([]byte("other")); return c }(), wantErr: "wrong signature"},
		{name: "garbage signature", cmd: func() Command { c := cmd; c.Sig = "00"; return c }(), wantErr: "wrong signature"},
		{name: "action changed after signing", cmd: func() Command { c := signed(cmd); c.Action = Delete; return c }(), wantErr: "wrong signature"},
		{name: "time changed after signing", cmd: func() Command { c := signed(cmd); c.At = c.At.Add(time.Nanosecond); return c }(), wantErr: "wrong signature"},
		{name: "signed for another queue, sent to this one", cmd: func() Command {
			c := signed(Command{Queue: "payments", Action: Stop, At: now})
			c.Queue = "orders"
			return c
		}(), wantErr: "wrong signature"},
		{name: "at maxAge", cmd: signed(Command{Queue: "orders", Action: Stop, At: now.Add(-maxAge)})},
		{name: "too old", cmd: signed(Command{Queue: "orders", Action: Stop, At: now.Add(-maxAge - time.Millisecond)}), wantErr: "older than KillMaxAge 1m0s"},
		{name: "old without maxAge", cmd: signed(Command{Queue: "orders", Action: Stop, At: now.Add(-365 * 24 * time.Hour)}), maxAge: -1},
		{name: "ahead within skew", cmd: signed(Command{Queue: "orders", Action: Stop, At: now.Add(skew)})},
		{name: "ahead beyond skew", cmd: signed(Command{Queue: "orders", Action: Stop, At: now.Add(skew + time.Millisecond)}), wantErr: "dated 5.001s ahead of this clock, more than KillClockSkew 5s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queue, key, age := "orders", secret, maxAge
			if tc.queue != "" {
				queue = tc.queue
			}
			if tc.secret != nil {
				key = tc.secret
			}
			if tc.maxAge < 0 {
				age = 0
			}
			err := tc.cmd.Verify(queue, key, now, age, skew)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

// A signed command verifies after its way through JSON (no monotonic clock reading, and
// possibly another time zone on the sender), as Killer.command sends it.
func TestCommandSignatureSurvivesJSON(t *testing.T) {
	secret := []byte("s3cret")
	at := time.Now().In(time.FixedZone("X", -7*3600)) // with a monotonic reading
	cmd := Command{Queue: "orders", Action: Delete, At: at}
	cmd.Sign(secret)
	body, err := json.Marshal(cmd)
	require.NoError(t, err)

	var got Command
	require.NoError(t, json.Unmarshal(body, &got))
	assert.Equal(t, cmd.Sig, got.Sig)
	assert.NoError(t, got.Verify("orders", secret, at, time.Minute, time.Second))

	got.At = got.At.UTC()
	assert.NoError(t, got.Verify("orders", secret, at, time.Minute, time.Second), "the signature covers the instant, not the zone")
	assert.Error(t, got.Verify("orders", []byte("other"), at, time.Minute, time.Second))
}
