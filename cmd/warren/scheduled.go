package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/internal/when"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/ops"
)

func newScheduled(g *globals) *cobra.Command {
	scheduled := &cobra.Command{
		Use:   "scheduled",
		Short: "List or cancel the delayed messages published with a schedule id (warren.Schedule)",
		Long: "List or cancel the delayed messages published with a schedule id (warren.Schedule), from the\n" +
			"ledger of the delay levels (a stream): the levels themselves are not read, so their order and\n" +
			"timing are not disturbed. A cancelled message is acked unhandled by warren consumers whose\n" +
			"handlers have ledger.Ledger.Middleware.\n\n" + idForms,
	}
	scheduled.AddCommand(newScheduledList(g), newScheduledCancel(g))
	return scheduled
}

// withOps runs op with the Ops of the delay levels the flags name: its ledger, bounded by
// --timeout.
func (g *globals) withOps(cmd *cobra.Command, df *delayFlags, op func(o *ops.Ops) error) error {
	cfg, err := df.config(g.timeout)
	if err != nil {
		return err
	}
	o, err := g.ops(cmd, cfg.Delay)
	if err != nil {
		return err
	}
	defer o.Close()
	return op(o)
}

func newScheduledList(g *globals) *cobra.Command {
	var (
		df                *delayFlags
		destination, till string
		asJSON            bool
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List the scheduled messages that wait: id, destination, due time",
		Long: "List the scheduled messages that wait: id, destination, due time, sorted by due time.\n\n" + idForms +
			"\n\n--json prints each entry with its id as a JSON string, and, when that string cannot hold\n" +
			"the id exactly (bytes that are not UTF-8, or U+FFFD), its bytes in base64 as id_base64.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := ledger.Filter{Destination: destination}
			if till != "" {
				var err error
				if f.Before, err = when.Parse(till, time.Now()); err != nil {
					return fmt.Errorf("--before: %w", err)
				}
			}
			return g.withOps(cmd, df, func(o *ops.Ops) error {
				entries, err := o.Scheduled(cmd.Context(), f)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					if entries == nil {
						entries = []ledger.Entry{}
					}
					return printJSON(out, entries)
				}
				tw := newTable(out)
				fmt.Fprintln(tw, "ID\tDESTINATION\tROUTING KEY\tDUE")
				now := time.Now()
				for _, e := range entries {
					due := e.Due.Format(time.RFC3339)
					if e.Due.After(now) {
						due += " (in " + human(e.Due.Sub(now).Round(time.Second)) + ")"
					} else {
						due += " (" + human(now.Sub(e.Due).Round(time.Second)) + " ago: not consumed yet)"
					}
					key := e.RoutingKey
					if key == "" {
						key = "-"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", showID(e.ID), e.Destination(), key, due)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				fmt.Fprintln(out, plural(len(entries), "message")+" scheduled")
				return nil
			})
		},
	}
	df = addDelayFlags(list.Flags())
	list.Flags().StringVar(&destination, "topic", "", "only messages to this queue or exchange")
	list.Flags().StringVar(&till, "before", "", "only messages due before this time: RFC 3339, or +D from now (+24h)")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

func newScheduledCancel(g *globals) *cobra.Command {
	var (
		df      *delayFlags
		fromB64 bool
	)
	cancel := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel the message scheduled under ID: warren consumers never handle it",
		Long: "Cancel the message scheduled under ID: warren consumers (handlers with ledger.Ledger.Middleware)\n" +
			"never handle it. Exit code 1 if it was delivered before the cancellation, 2 if nothing was\n" +
			"scheduled under ID (the cancellation is recorded all the same).\n\n" + idForms +
			"\n\nWith --base64, ID is the id's bytes in standard base64 (id_base64 of `list --json`, or\n" +
			"its id encoded: jq -r '.[] | .id_base64 // (.id | @base64)').",
		Example: "  warren scheduled cancel reminder-42\n" +
			"  warren scheduled cancel '\"tick\\x00\"'\n" +
			"  warren scheduled cancel --base64 b3JkZXItN/8=",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			read := parseID
			if fromB64 {
				read = parseBase64ID
			}
			id, err := read(args[0])
			if err != nil {
				return err
			}
			return g.withOps(cmd, df, func(o *ops.Ops) error {
				err := o.Cancel(cmd.Context(), id)
				switch {
				case errors.Is(err, ledger.ErrUnknown):
					msg := fmt.Sprintf("%s: %s (the cancellation is recorded)", ledger.ErrUnknown, showID(id))
					return &exitError{exitNoQueue, msg, err}
				case errors.Is(err, ledger.ErrDelivered):
					return fmt.Errorf("%w: %s", ledger.ErrDelivered, showID(id))
				case err != nil:
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "cancelled %s: it will not be handled\n", showID(id))
				return nil
			})
		},
	}
	df = addDelayFlags(cancel.Flags())
	cancel.Flags().BoolVar(&fromB64, "base64", false, "ID is the id's bytes in standard base64 (id_base64 of list --json)")
	return cancel
}

// idForms is how the scheduled commands print and read ids, for their help.
const idForms = "An ID is printed as it is when it is one word of printable characters; any other (with NUL,\n" +
	"bytes that are not UTF-8, controls, U+FFFD, spaces, quotes or backslashes) is printed as a\n" +
	"double-quoted Go string literal, every such byte escaped: \"tick\\x00\", \"order-7\\xff\", \"\\ufffd\".\n" +
	"cancel reads an ID that starts with a double quote in that form (paste it between single\n" +
	"quotes: '\"tick\\x00\"'), any other as it is."
