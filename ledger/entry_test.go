package ledger_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/ledger"
)

// An Entry's JSON gives back its id byte for byte; id_base64 is written only for an id that
// a JSON string cannot keep (not UTF-8, or holding U+FFFD), so other ids read as before.
func TestEntryJSONKeepsTheID(t *testing.T) {
	due := time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)
	for id, base64 := range map[string]bool{
		"plain-42": false, "<a&b>": false, "nul\x00": false, "c1\u0085\u009b": false, "\u2028": false,
		"bad\xff": true, "bad\xfe": true, "\ufffd": true, "\xc3\x28": true, strings.Repeat("\xff", 1000): true,
	} {
		body, err := json.Marshal(ledger.Entry{ID: id, Queue: "q", Due: due})
		require.NoError(t, err)
		assert.Equal(t, base64, strings.Contains(string(body), `"id_base64":`), "%q: %s", id, body)
		var e ledger.Entry
		require.NoError(t, json.Unmarshal(body, &e))
		assert.Equal(t, ledger.Entry{ID: id, Queue: "q", Due: due}, e, "%q", id)
	}
	var e ledger.Entry
	require.NoError(t, json.Unmarshal([]byte(`{"id":"before","queue":"q"}`), &e), "as earlier versions wrote it")
	assert.Equal(t, "before", e.ID)
	assert.Error(t, json.Unmarshal([]byte(`{"id":"x","id_base64":"not base64!"}`), &e))
}
