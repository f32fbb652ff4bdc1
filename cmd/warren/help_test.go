package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// valueNames are the value names help may show after a flag: its type ("" for a boolean).
// pflag takes back-quoted text in a flag's usage as the value name instead, so a usage that
// quotes a command in back quotes renders as e.g. "--group-id poison list --group".
var valueNames = map[string]bool{"": true, "string": true, "stringArray": true, "duration": true, "int": true, "float": true}

// Every command's help renders, and no flag's value name comes from its usage text.
func TestHelpRenders(t *testing.T) {
	t.Parallel()
	var walk func(cmd *cobra.Command)
	n := 0
	walk = func(cmd *cobra.Command) {
		n++
		check := func(f *pflag.Flag) {
			name, _ := pflag.UnquoteUsage(f)
			assert.True(t, valueNames[name], "%s --%s: value name %q (back quotes in its usage?)", cmd.CommandPath(), f.Name, name)
		}
		cmd.LocalFlags().VisitAll(check)
		cmd.InheritedFlags().VisitAll(check)

		root := newRoot()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		path := strings.Fields(cmd.CommandPath())[1:]
		root.SetArgs(append(path, "--help"))
		require.NoError(t, root.Execute(), cmd.CommandPath())
		assert.Contains(t, out.String(), "Usage:\n  "+cmd.CommandPath(), cmd.CommandPath())
		for _, c := range cmd.Commands() {
			walk(c)
		}
	}
	walk(newRoot())
	assert.Greater(t, n, 15, "commands walked")
}
