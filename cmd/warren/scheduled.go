package main

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/internal/when"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/ops"
)

func newScheduled(g *globals) *cobra.Command {
	scheduled := &cobra.Command{
		Use:   "scheduled",
		Short: "List or cancel the delayed messages published with a schedule id (dlx.Schedule)",
		Long: "List or cancel the delayed messages published with a schedule id (dlx.Schedule), from the\n" +
			"ledger of the delay levels (a stream): the levels themselves are not read, so their order and\n" +
			"timing are not disturbed. A cancelled message is acked unhandled by warren consumers whose\n" +
			"handlers have ledger.Ledger.Middleware.",
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
		Args:  cobra.NoArgs,
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
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
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
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.ID, e.Destination(), key, due)
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
	var df *delayFlags
	cancel := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel the message scheduled under ID: warren consumers never handle it",
		Long: "Cancel the message scheduled under ID: warren consumers (handlers with ledger.Ledger.Middleware)\n" +
			"never handle it. Exit code 1 if it was delivered before the cancellation, 2 if nothing was\n" +
			"scheduled under ID (the cancellation is recorded all the same).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withOps(cmd, df, func(o *ops.Ops) error {
				err := o.Cancel(cmd.Context(), args[0])
				switch {
				case errors.Is(err, ledger.ErrUnknown):
					return &exitError{exitNoQueue, err.Error(), err}
				case err != nil:
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "cancelled %s: it will not be handled\n", args[0])
				return nil
			})
		},
	}
	df = addDelayFlags(cancel.Flags())
	return cancel
}
