// Command warren is the ops CLI of warren.
//
//	warren kill QUEUE [--delete]   stop every consumer of QUEUE, in every process
//	warren resume QUEUE            let them consume again
//
// The broker is $WARREN_AMQP_URL (or --url); the kill secret, when consumers require signed
// commands, is read from $WARREN_KILL_SECRET (never from the command line, where other users
// of the machine could see it).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/router"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	root := &cobra.Command{
		Use:          "warren",
		Short:        "Operate warren's queues on RabbitMQ",
		SilenceUsage: true,
	}
	root.PersistentFlags().StringVar(&url, "url", url, "broker URL (default $WARREN_AMQP_URL)")
	killer := func() (*router.Killer, error) {
		return router.NewKiller(router.KillerConfig{URL: url, Secret: []byte(os.Getenv("WARREN_KILL_SECRET"))}, nil)
	}

	var del bool
	kill := &cobra.Command{
		Use:   "kill QUEUE",
		Short: "Stop every consumer of QUEUE, in every process (remembered until resume)",
		Long: "Stop every consumer of QUEUE, in every process: each finishes and acks what it is processing,\n" +
			"returns what it prefetched to the queue, and stops. Consumers that start later do not consume\n" +
			"until `warren resume QUEUE`. With --delete the consumers drain the queue instead, and it is\n" +
			"deleted once empty, with its poison queue (if empty) and kill exchange.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := killer()
			if err != nil {
				return err
			}
			action := router.Stop
			if del {
				action = router.Delete
			}
			if err := k.Kill(context.Background(), args[0], action); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sent %s to every consumer of %s\n", action, args[0])
			return nil
		},
	}
	kill.Flags().BoolVar(&del, "delete", false, "drain the queue, then delete it")

	resume := &cobra.Command{
		Use:   "resume QUEUE",
		Short: "Lift a kill: the consumers of QUEUE take messages again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := killer()
			if err != nil {
				return err
			}
			if err := k.Resume(context.Background(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sent resume to every consumer of %s\n", args[0])
			return nil
		},
	}
	root.AddCommand(kill, resume)
	return root
}
