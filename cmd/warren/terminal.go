package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// visible returns s with every character a terminal would act on written out visibly, so that
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
func visible(s string) string {
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

// unsafeRune reports whether visible rewrites r (utf8.RuneError stands for a byte that is
// not UTF-8, as well as for U+FFFD itself, which visible then keeps).
func unsafeRune(r rune) bool {
	return r < 0x20 && r != '\n' && r != '\t' || r >= 0x7f && r <= 0x9f || r == utf8.RuneError
}

// safeWriter writes through visible. Each Write is taken as whole text: the writers of the
// CLI (fmt, tabwriter, encoding/json, the logger) never split a character across two.
type safeWriter struct{ w io.Writer }

func (s safeWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(s.w, visible(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// table aligns the columns of text (cells ended by tabs) that passes through visible first:
// the widths are those of the text as shown, and tabwriter never sees a byte 0xff of broker
// data, which it would take for its escape character.
type table struct{ *tabwriter.Writer }

func newTable(out io.Writer) table { return table{tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)} }

func (t table) Write(p []byte) (int, error) { return safeWriter{t.Writer}.Write(p) }

// safeOutput makes everything cmd's root command writes (tables, messages, errors, the log)
// pass through visible. It is the root's PersistentPreRun, so every command's output is
// covered, however the root's writers were set.
func safeOutput(cmd *cobra.Command, _ []string) {
	root := cmd.Root()
	root.SetOut(safe(root.OutOrStdout()))
	root.SetErr(safe(root.ErrOrStderr()))
}

// safe returns w writing through visible.
func safe(w io.Writer) io.Writer {
	if _, ok := w.(safeWriter); ok {
		return w
	}
	return safeWriter{w}
}

// raw is the writer under a safe one: for what the CLI writes itself to a terminal (the
// progress bar's carriage returns), never broker data.
func raw(w io.Writer) io.Writer {
	if s, ok := w.(safeWriter); ok {
		return s.w
	}
	return w
}

// isTerminal reports whether w (or the writer under a safe one) is a terminal. A character
// device is not enough: /dev/null is one too.
func isTerminal(w any) bool {
	if s, ok := w.(safeWriter); ok {
		w = s.w
	}
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
