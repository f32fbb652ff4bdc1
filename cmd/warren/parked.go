package main

import (
	"github.com/spf13/cobra"

	"context"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

func newParked(g *globals) *cobra.Command {
	parked := &cobra.Command{
		Use:   "parked",
		Short: "List or replay the delayed messages that were parked because their destination was gone",
		Long: "A delayed message whose destination no longer exists when it is due, or that the delay levels\n" +
			"cannot route, is parked in the parking queue of the delay levels, never dropped. The delay level\n" +
			"flags (or --config FILE) say which levels.",
	}
	src := func([]string) (messages, topology.Delay) {
		return messages{
			what: "parking queue", parked: true,
			browse: func(ctx context.Context, o *ops.Ops, b ops.Browse) ([]ops.Message, error) {
				return o.Parked(ctx, b)
			},
			replay: func(ctx context.Context, o *ops.Ops, opt ops.ReplayOptions) (ops.ReplayResult, error) {
				return o.ReplayParked(ctx, opt)
			},
		}, topology.Delay{}
	}
	parked.AddCommand(
		newList(g, "list", "List the parked messages", cobra.NoArgs, src, delayOf(g)),
		newReplay(g, "replay", "Send the parked messages to their destination (or --to a queue), removing them from the parking queue", cobra.NoArgs, src, delayOf(g)),
	)
	return parked
}

// delayOf adds the delay level flags to cmd and returns what reads them.
func delayOf(g *globals) func(cmd *cobra.Command) func() (topology.Delay, error) {
	return func(cmd *cobra.Command) func() (topology.Delay, error) {
		df := addDelayFlags(cmd.Flags())
		return func() (topology.Delay, error) {
			cfg, err := df.config(g.timeout)
			return cfg.Delay, err
		}
	}
}
