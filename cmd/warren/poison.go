package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

// messages are the messages a poison or parked command works on.
type messages struct {
	what   string // "poison queue Q.poison", "parking queue"
	parked bool
	browse func(ctx context.Context, o *ops.Ops, b ops.Browse) ([]ops.Message, error)
	replay func(ctx context.Context, o *ops.Ops, opt ops.ReplayOptions) (ops.ReplayResult, error)
}

func poisonOf(queue string) messages {
	return messages{
		what: "poison queue " + topology.PoisonQueue(queue),
		browse: func(ctx context.Context, o *ops.Ops, b ops.Browse) ([]ops.Message, error) {
			return o.Poisoned(ctx, queue, b)
		},
		replay: func(ctx context.Context, o *ops.Ops, opt ops.ReplayOptions) (ops.ReplayResult, error) {
			return o.ReplayPoisoned(ctx, queue, opt)
		},
	}
}

func newPoison(g *globals) *cobra.Command {
	poison := &cobra.Command{
		Use:   "poison",
		Short: "List, group, replay, export or purge the messages of a poison queue",
		Long: "The poison queue of a work queue Q is Q.poison: the messages its handlers gave up on, each with\n" +
			"the reason, the error, the handler, the attempts and the failure times in its headers.\n" +
			"Listing and exporting leave the queue as it was (same messages, same order).",
	}
	byQueue := func(args []string) (messages, topology.Delay) { return poisonOf(args[0]), topology.Delay{} }
	poison.AddCommand(
		newList(g, "list QUEUE", "List the poison messages of QUEUE, or their failure groups", cobra.ExactArgs(1), byQueue, nil),
		newReplay(g, "replay QUEUE", "Send poison messages of QUEUE back to QUEUE (or --to another), removing them from the poison queue", cobra.ExactArgs(1), byQueue, nil),
		newExport(g),
		newPurge(g),
	)
	return poison
}

// newList is `poison list` or `parked list`; delayFlags, if set, adds the delay level flags.
func newList(g *globals, use, short string, args cobra.PositionalArgs, src func([]string) (messages, topology.Delay),
	delayFlagsOf func(*cobra.Command) func() (topology.Delay, error)) *cobra.Command {
	var (
		ff     *filterFlags
		limit  int
		asJSON bool
		group  bool
		delay  func() (topology.Delay, error)
	)
	list := &cobra.Command{
		Use: use, Short: short, Args: args,
		RunE: func(cmd *cobra.Command, args []string) error {
			now := time.Now()
			flt, err := ff.filter(now)
			if err != nil {
				return err
			}
			m, o, err := g.open(cmd, args, src, delay)
			if err != nil {
				return err
			}
			defer o.Close()
			b := ops.Browse{Filter: flt, Limit: limit}
			if group {
				b.Limit = 0
			}
			msgs, err := m.browse(cmd.Context(), o, b)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch {
			case group && asJSON:
				return printJSON(out, nonNil(ops.Group(msgs)))
			case group:
				return printGroups(out, ops.Group(msgs), now)
			case asJSON:
				return printJSON(out, nonNil(msgs))
			}
			if m.parked {
				return printParked(out, msgs)
			}
			return printMessages(out, msgs, now)
		},
	}
	ff = addFilterFlags(list.Flags())
	list.Flags().IntVar(&limit, "limit", 0, "list at most this many (0: all)")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	list.Flags().BoolVar(&group, "group", false, "group the failures by handler, error type and normalised error, with counts")
	if delayFlagsOf != nil {
		delay = delayFlagsOf(list)
	}
	return list
}

// open returns the messages that src makes of args, and an Ops for them (on the delay levels
// that delay reads from the flags, if set), which the caller closes.
func (g *globals) open(cmd *cobra.Command, args []string, src func([]string) (messages, topology.Delay),
	delay func() (topology.Delay, error)) (messages, *ops.Ops, error) {
	m, d := src(args)
	if delay != nil {
		var err error
		if d, err = delay(); err != nil {
			return m, nil, err
		}
	}
	o, err := g.ops(cmd, d)
	return m, o, err
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func printMessages(out io.Writer, msgs []ops.Message, now time.Time) error {
	tw := newTable(out)
	fmt.Fprintln(tw, "POS\tID\tREASON\tERROR\tHANDLER\tATTEMPTS\tFIRST FAILURE\tLAST FAILURE\tGROUP\tTRACE\tDESTINATION")
	for _, m := range msgs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", m.Position, cutID(m.ID, 36), m.Reason, cut(m.Error, 60),
			cut(m.Handler, 24), m.Attempts, ago(m.FirstFailure, now), ago(m.LastFailure, now), cut(m.Group, 8), cut(m.TraceID, 32), m.Destination)
	}
	fmt.Fprintln(tw, plural(len(msgs), "message"))
	return tw.Flush()
}

func printParked(out io.Writer, msgs []ops.Message) error {
	tw := newTable(out)
	fmt.Fprintln(tw, "POS\tID\tREASON\tDESTINATION\tCONTENT TYPE")
	for _, m := range msgs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", m.Position, cutID(m.ID, 36), m.Reason, cut(m.Destination, 60), cut(m.ContentType, 30))
	}
	fmt.Fprintln(tw, plural(len(msgs), "message"))
	return tw.Flush()
}

func printGroups(out io.Writer, groups []ops.FailureGroup, now time.Time) error {
	tw := newTable(out)
	fmt.Fprintln(tw, "GROUP\tCOUNT\tHANDLER\tERROR TYPE\tERROR\tFIRST\tLAST\tEXAMPLE")
	for _, gr := range groups {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", cut(gr.ID, 8), gr.Count, cut(gr.Handler, 24), cut(gr.ErrorType, 30),
			cut(gr.Error, 60), ago(gr.First, now), ago(gr.Last, now), showID(gr.Example))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(out, "replay a group with: warren poison replay QUEUE --group-id GROUP")
	return err
}

// newReplay is `poison replay` or `parked replay`.
func newReplay(g *globals, use, short string, args cobra.PositionalArgs, src func([]string) (messages, topology.Delay),
	delayFlagsOf func(*cobra.Command) func() (topology.Delay, error)) *cobra.Command {
	var (
		ff     *filterFlags
		opt    ops.ReplayOptions
		asJSON bool
		delay  func() (topology.Delay, error)
	)
	replay := &cobra.Command{
		Use: use, Short: short, Args: args,
		Long: short + ".\n\nEach message is published again and removed from the queue in one AMQP transaction: a\n" +
			"dropped connection is survived (nothing is lost or sent twice), and an interrupted replay is\n" +
			"resumed by running it again. A replayed message keeps its id, body, properties and headers,\n" +
			"loses the poison headers and the attempt counter (its handler has every attempt again), and\n" +
			"gains warren_replays. Messages whose destination does not exist are left where they are.",
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if opt.Filter, err = ff.filter(time.Now()); err != nil {
				return err
			}
			m, o, err := g.open(cmd, args, src, delay)
			if err != nil {
				return err
			}
			defer o.Close()
			errOut := raw(cmd.ErrOrStderr()) // numbers only, and carriage returns
			if isTerminal(errOut) {
				opt.Progress = func(r ops.ReplayResult) {
					fmt.Fprintf(errOut, "\r%s replayed %d, scanned %d of %d", bar(r.Scanned, r.Total, 30), r.Replayed, r.Scanned, r.Total)
				}
			}
			res, err := m.replay(cmd.Context(), o, opt)
			if opt.Progress != nil {
				fmt.Fprintln(errOut)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if jerr := printJSON(out, res); jerr != nil {
					return jerr
				}
			} else {
				printReplay(out, m.what, res, opt.To)
			}
			if err != nil {
				return err
			}
			return replayErr(res, m.what)
		},
	}
	ff = addFilterFlags(replay.Flags())
	replay.Flags().StringVar(&opt.To, "to", "", "send them to this queue instead of where they were going")
	replay.Flags().IntVar(&opt.Limit, "limit", 0, "replay at most this many (0: all that match)")
	replay.Flags().Float64Var(&opt.Rate, "rate", 0, "replay at most this many per second (0: no limit)")
	replay.Flags().IntVar(&opt.Batch, "batch", 100, "messages per transaction")
	replay.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	if delayFlagsOf != nil {
		delay = delayFlagsOf(replay)
	}
	return replay
}

// replayErr is the error that gives a replay that left selected messages behind its exit
// code: 3 if it replayed some (done in part); else 2 if every one was left because its
// destination does not exist, 1 for any other reason.
func replayErr(r ops.ReplayResult, what string) error {
	n := failed(r)
	if n == 0 {
		return nil
	}
	code := 1
	switch {
	case r.Replayed > 0:
		code = exitUnconfirmed
	case r.Missing == n:
		code = exitNoQueue
	}
	return &exitError{code, fmt.Sprintf("%s could not be replayed (left in the %s)", plural(n, "selected message"), what), nil}
}

func failed(r ops.ReplayResult) int {
	n := 0
	for _, c := range r.Failed {
		n += c
	}
	return n
}

func printReplay(out io.Writer, what string, r ops.ReplayResult, to string) {
	dest := "where they were going"
	if to != "" {
		dest = "queue " + to
	}
	fmt.Fprintf(out, "replayed %s of the %s to %s (scanned %d", plural(r.Replayed, "message"), what, dest, r.Scanned)
	if r.Reconnects > 0 {
		fmt.Fprintf(out, ", reconnected %s", plural(r.Reconnects, "time"))
	}
	fmt.Fprintln(out, ")")
	for why, n := range r.Failed {
		fmt.Fprintf(out, "left %d: %s\n", n, why)
	}
}

// bar draws done of total in width characters.
func bar(done, total, width int) string {
	n := width
	if total > 0 {
		n = min(width, done*width/total)
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

func newExport(g *globals) *cobra.Command {
	var (
		ff    *filterFlags
		limit int
	)
	export := &cobra.Command{
		Use:   "export QUEUE",
		Short: "Write the poison messages of QUEUE as JSON lines (headers and body, base64), leaving the queue as it was",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			flt, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			o, err := g.ops(cmd, topology.Delay{})
			if err != nil {
				return err
			}
			defer o.Close()
			msgs, err := o.Poisoned(cmd.Context(), args[0], ops.Browse{Filter: flt, Limit: limit, Bodies: true})
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetEscapeHTML(false)
			for _, m := range msgs {
				if err := enc.Encode(m); err != nil {
					return err
				}
			}
			return nil
		},
	}
	ff = addFilterFlags(export.Flags())
	export.Flags().IntVar(&limit, "limit", 0, "export at most this many (0: all)")
	return export
}

func newPurge(g *globals) *cobra.Command {
	var yes bool
	purge := &cobra.Command{
		Use:   "purge QUEUE",
		Short: "Delete every message of the poison queue of QUEUE (asks first, unless --yes)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := g.ops(cmd, topology.Delay{})
			if err != nil {
				return err
			}
			defer o.Close()
			poison := topology.PoisonQueue(args[0])
			if !yes {
				s, err := o.Status(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if s.Queues[0].Poison < 0 {
					return fmt.Errorf("%w: %s", ops.ErrNoQueue, poison)
				}
				if !isTerminal(cmd.InOrStdin()) {
					return fmt.Errorf("%s holds %s: purge them with --yes", poison, plural(s.Queues[0].Poison, "message"))
				}
				fmt.Fprintf(cmd.OutOrStdout(), "delete the %s of %s? [y/N] ", plural(s.Queues[0].Poison, "message"), poison)
				answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
					return errors.New("not purged")
				}
			}
			n, err := o.PurgePoisoned(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %s of %s\n", plural(n, "message"), poison)
			return nil
		},
	}
	purge.Flags().BoolVar(&yes, "yes", false, "do not ask")
	return purge
}
