package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

func newHeld(g *globals) *cobra.Command {
	held := &cobra.Command{
		Use:   "held",
		Short: "List, release or skip the held keys of a queue ordered by key",
		Long: "A queue ordered by key (topology lanes) holds a key whose message was poisoned: the key's later\n" +
			"messages wait, in their order, in the lane's held queue QUEUE.lane.N.held until the key is released (they\n" +
			"are handled, in their order, then what comes after) or skipped (they go to the poison queue,\n" +
			"with the reason, and what comes after is handled). The processes that handle the queue carry\n" +
			"out a release or a skip within a second or so; none is while no process handles the queue.\n" +
			"The poisoned message that held the key stays in the poison queue either way.",
	}
	held.AddCommand(newHeldList(g), newHeldAct(g, "release", "Release held keys of QUEUE: their held messages are handled, in their order",
		(*ops.Ops).ReleaseKey), newHeldAct(g, "skip", "Skip held keys of QUEUE: their held messages go to the poison queue, in their order",
		(*ops.Ops).SkipKey))
	return held
}

func newHeldList(g *globals) *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:   "list QUEUE",
		Short: "List the held keys of QUEUE: key, lane, messages waiting, since, the poisoned message and its error",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := g.ops(cmd, topology.Delay{})
			if err != nil {
				return err
			}
			defer o.Close()
			keys, err := o.Held(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if keys == nil {
					keys = []ops.HeldKey{}
				}
				return printJSON(out, keys)
			}
			tw := newTable(out)
			fmt.Fprintln(tw, "KEY\tLANE\tWAITING\tSINCE\tMESSAGE\tERROR\tACTION")
			for _, k := range keys {
				action := k.Action
				if action == "" {
					action = "-"
				}
				fmt.Fprintf(tw, "%q\t%s\t%d\t%s\t%s\t%s\t%s\n", k.Key, k.Lane, k.Messages, k.Since.Format(time.RFC3339),
					showID(k.MessageID), strings.ReplaceAll(k.Error, "\n", " "), action)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintln(out, plural(len(keys), "key")+" held")
			return nil
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

func newHeldAct(g *globals, verb, short string, act func(*ops.Ops, context.Context, string, string) error) *cobra.Command {
	var all bool
	c := &cobra.Command{
		Use:   verb + " QUEUE [KEY...]",
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			queue, keys := args[0], args[1:]
			if all == (len(keys) > 0) {
				return fmt.Errorf("%s: name the keys, or --all", verb)
			}
			o, err := g.ops(cmd, topology.Delay{})
			if err != nil {
				return err
			}
			defer o.Close()
			if all {
				held, err := o.Held(cmd.Context(), queue)
				if err != nil {
					return err
				}
				for _, k := range held {
					keys = append(keys, k.Key)
				}
			}
			for _, k := range keys {
				if err := act(o, cmd.Context(), queue, k); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %q\n", verb, k)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&all, "all", false, "every key held now")
	return c
}
