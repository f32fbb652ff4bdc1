package visible

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestVisible(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, ünïcode, \\x1b as typed":           "plain text, ünïcode, \\x1b as typed",
		"tab\tand newline\n":                            "tab\tand newline\n",
		"carriage\rreturn":                              `carriage\x0dreturn`,
		"\x1b[2J\x1b]0;pwned\x07\x00\x7f\u009b31m<end>": `\x1b[2J\x1b]0;pwned\x07\x00\u007f\u009b31m<end>`,
		"bad \xff\xfe utf-8, \ufffd kept":               `bad \xff\xfe utf-8, ` + "\ufffd kept",
		"\u0080\u009f\u00a0":                            `\u0080\u009f` + "\u00a0",
	} {
		assert.Equal(t, want, String(in), "%q", in)
	}
}
