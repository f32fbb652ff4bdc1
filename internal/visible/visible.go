// Package visible writes out the characters of a text that a terminal or a reader could not
// see, so that text read from the broker shows what it is.
package visible

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// String returns s with every character a terminal would act on written out visibly, so that
// no value read from the broker (an id, an error text, a header, a queue name) can move the
// cursor, clear the screen, set the window title or ring the bell of whoever reads the output:
//
//   - C0 controls but newline and tab (U+0000–U+001F: ESC, NUL, BEL, CR, ...) as \x1b, \x00;
//   - DEL and the C1 controls (U+007F–U+009F: CSI U+009B, ...) as \u007f, \u009b;
//   - each byte that is not part of valid UTF-8 as \xff.
//
// Everything else, backslashes included, is left as it is. DEL and C1 are written as JSON
// writes them: JSON passes through unchanged in meaning (encoding/json writes C0 controls as
// escapes already, and never invalid UTF-8), so --json and export keep every value exact.
func String(s string) string {
	i := strings.IndexFunc(s, unsafeRune)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for s = s[i:]; s != ""; {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case r < 0x20 && r != '\n' && r != '\t':
			fmt.Fprintf(&b, `\x%02x`, r)
		case r >= 0x7f && r <= 0x9f:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

// unsafeRune reports whether String rewrites r (utf8.RuneError stands for a byte that is
// not UTF-8, as well as for U+FFFD itself, which String then keeps).
func unsafeRune(r rune) bool {
	return r < 0x20 && r != '\n' && r != '\t' || r >= 0x7f && r <= 0x9f || r == utf8.RuneError
}
