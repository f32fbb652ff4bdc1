package main

import (
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/warrenmq/warren/internal/visible"
	"golang.org/x/term"
)

// safeWriter writes through visible. Each Write is taken as whole text: the writers of the
// CLI (fmt, tabwriter, encoding/json, the logger) never split a character across two.
type safeWriter struct{ w io.Writer }

func (s safeWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(s.w, visible.String(string(p))); err != nil {
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
