package ledger

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lossy makes of an id what encoding/json does (as earlier versions wrote ids).
func TestLossyIsWhatJSONWrites(t *testing.T) {
	ids := []string{"", "plain", "\xff", "a\xff\xfeb", "\ufffd\xff", "\xc3\x28", "\xe2\x82", "\xed\xa0\x80", "\x00\u0085"}
	for range 1000 {
		b := make([]byte, rand.IntN(12))
		for i := range b {
			b[i] = byte(rand.Uint32())
		}
		ids = append(ids, string(b))
	}
	for _, id := range ids {
		body, err := json.Marshal(id)
		require.NoError(t, err)
		var back string
		require.NoError(t, json.Unmarshal(body, &back))
		assert.Equal(t, back, lossy(id), "%q", id)
	}
}
