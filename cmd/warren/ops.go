package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/warrenmq/warren/internal/mgmt"
	"github.com/warrenmq/warren/internal/when"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

// ops is an ops.Ops on the broker of g, for the delay levels d, closed by the caller.
func (g *globals) ops(cmd *cobra.Command, d topology.Delay) (*ops.Ops, error) {
	conn, err := g.connection()
	if err != nil {
		return nil, err
	}
	if u := g.managementURL(); u != "" {
		if _, err := mgmt.New(u); err != nil {
			return nil, fmt.Errorf("--management: %w", err)
		}
	}
	return ops.New(ops.Config{Connection: conn, Delay: d, KillSecret: []byte(os.Getenv("WARREN_KILL_SECRET")), Timeout: g.timeout,
		Management: g.managementURL()}, logger(cmd))
}

// filterFlags are the flags that select poison or parked messages.
type filterFlags struct {
	ids                   []string
	group, errRE, handler string
	reason, since, until  string
	where                 []string
}

func addFilterFlags(fs *pflag.FlagSet) *filterFlags {
	f := &filterFlags{}
	fs.StringArrayVar(&f.ids, "id", nil, `only the message with this id: as it is, or quoted as list prints it ("pay\x00") (repeatable)`)
	fs.StringVar(&f.group, "group-id", "", "only the messages of this failure group (the GROUP column of \"poison list --group\")")
	fs.StringVar(&f.errRE, "error", "", "only the messages whose error matches this regular expression")
	fs.StringVar(&f.handler, "handler", "", "only the messages of this handler")
	fs.StringVar(&f.reason, "reason", "", `only the messages given up for this reason ("attempts exhausted", "permanent error", ...)`)
	fs.StringVar(&f.since, "since", "", "only the messages that last failed at or after this time: RFC 3339, or a duration ago (2h: two hours ago)")
	fs.StringVar(&f.until, "until", "", "only the messages that last failed before this time (as --since)")
	fs.StringArrayVar(&f.where, "where", nil, "only the messages with this header: name=value (repeatable)")
	return f
}

func (f *filterFlags) filter(now time.Time) (ops.Filter, error) {
	flt := ops.Filter{Group: f.group, Handler: f.handler, Reason: f.reason}
	var err error
	if len(f.ids) > 0 {
		if flt.IDs, err = parseIDs("--id", f.ids); err != nil {
			return flt, err
		}
	}
	if f.errRE != "" {
		if flt.Error, err = regexp.Compile(f.errRE); err != nil {
			return flt, fmt.Errorf("--error: %w", err)
		}
	}
	if flt.Since, err = when.AgoIfSet(f.since, now); err != nil {
		return flt, fmt.Errorf("--since: %w", err)
	}
	if flt.Until, err = when.AgoIfSet(f.until, now); err != nil {
		return flt, fmt.Errorf("--until: %w", err)
	}
	for _, w := range f.where {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return flt, fmt.Errorf("--where %q: want name=value", w)
		}
		if flt.Headers == nil {
			flt.Headers = map[string]string{}
		}
		flt.Headers[k] = v
	}
	return flt, nil
}

// printJSON writes v as indented JSON.
func printJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// ago says how long before now t was, to the second ("-" for the zero time).
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return human(now.Sub(t).Round(time.Second)) + " ago"
}

// cut shortens s to n characters, on one line.
func cut(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}
