package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/router"
)

// killer is a router.Killer on the broker g names, signing with $WARREN_KILL_SECRET.
func (g *globals) killer(cmd *cobra.Command) (*router.Killer, error) {
	conn, err := g.connection()
	if err != nil {
		return nil, err
	}
	return router.NewKiller(router.KillerConfig{
		Connection:     conn,
		KillSecret:     []byte(os.Getenv("WARREN_KILL_SECRET")),
		PublishTimeout: g.timeout,
	}, logger(cmd))
}

func newKill(g *globals) *cobra.Command {
	var del bool
	kill := &cobra.Command{
		Use:   "kill QUEUE",
		Short: "Stop every consumer of QUEUE, in every process (remembered until resume)",
		Long: "Stop every consumer of QUEUE, in every process: each finishes and acks what it is processing,\n" +
			"returns what it prefetched to the queue, and stops. Consumers that start later do not consume\n" +
			"until `warren resume QUEUE`. With --delete the consumers drain the queue instead, and it is\n" +
			"deleted once empty, with its poison queue (if empty), kill exchange and kill state queue.\n" +
			"If no consumer is listening, it says so and exits 0: the kill is remembered all the same.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := g.killer(cmd)
			if err != nil {
				return err
			}
			action := router.Stop
			if del {
				action = router.Delete
			}
			return report(cmd.OutOrStdout(), k.Kill(context.Background(), args[0], action), action, args[0])
		},
	}
	kill.Flags().BoolVar(&del, "delete", false, "drain the queue, then delete it")
	return kill
}

func newResume(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "resume QUEUE",
		Short: "Lift a kill: the consumers of QUEUE take messages again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := g.killer(cmd)
			if err != nil {
				return err
			}
			return report(cmd.OutOrStdout(), k.Resume(context.Background(), args[0]), router.Resume, args[0])
		},
	}
}

// report prints what sending action to queue's consumers did, given the error it returned:
// nobody listening is a warning, not a failure.
func report(out io.Writer, err error, action router.Action, queue string) error {
	switch {
	case errors.Is(err, router.ErrNoListener):
		fmt.Fprintf(out, "warning: no consumer of %s is listening; %s is remembered for consumers that start later\n", queue, action)
		return nil
	case err != nil:
		return err
	}
	fmt.Fprintf(out, "sent %s to every consumer of %s\n", action, queue)
	return nil
}
