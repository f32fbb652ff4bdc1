package main

import (
	"os"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// purge runs `warren poison purge queue` with stdin and returns stdout, stderr and the exit
// code.
func purge(t *testing.T, url, queue string, stdin *os.File) (string, string, int) {
	t.Helper()
	root := newRoot()
	var out, errOut syncBuffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(stdin)
	root.SetArgs(cliArgs(url, "poison", "purge", queue))
	code := exitCode(root.Execute())
	return out.String(), errOut.String(), code
}

// Without --yes, purge asks only on a terminal: with stdin /dev/null (a character device,
// not a terminal) it asks nothing, deletes nothing and exits 1 saying --yes; on a terminal
// it asks, and deletes on "y".
func TestPurgePromptsOnlyOnATerminal(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("purge")
	poisonQueue(t, env, q, message.NewMessage("a", nil), message.NewMessage("b", nil))

	null, err := os.Open(os.DevNull)
	require.NoError(t, err)
	defer null.Close()
	stdout, stderr, code := purge(t, env.URL, q, null)
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout, "a prompt")
	assert.Contains(t, stderr, topology.PoisonQueue(q)+" holds 2 messages: purge them with --yes")
	assert.Equal(t, 2, env.Messages(topology.PoisonQueue(q)))

	tty := openPTY(t, "y\n")
	stdout, stderr, code = purge(t, env.URL, q, tty)
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "delete the 2 messages of "+topology.PoisonQueue(q)+"? [y/N] ")
	assert.Equal(t, 0, env.Messages(topology.PoisonQueue(q)))
}
