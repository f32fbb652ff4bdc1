// Command warren is the ops CLI of warren.
//
//	warren kill QUEUE [--delete]   stop every consumer of QUEUE, in every process
//	warren resume QUEUE            let them consume again
//
// The broker is --url (repeated, or separated by commas, for the nodes of a cluster), else
// $WARREN_AMQP_URL (comma-separated), else the local one (guest); no output shows a password. --timeout (default 30s) bounds each command. The kill secret, when consumers
// require signed commands, is read from $WARREN_KILL_SECRET (never from the command line,
// where other users of the machine could see it).
//
// When no consumer of QUEUE is listening, kill and resume print a warning and exit 0: the
// command is remembered, and consumers that start later obey it. Other errors exit 1.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpurl"
	"github.com/warrenmq/warren/router"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		os.Exit(1)
	}
}

// defaultURL is the broker when neither --url nor $WARREN_AMQP_URL says otherwise.
const defaultURL = "amqp://guest:guest@127.0.0.1:5672/"

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:          "warren",
		Short:        "Operate warren's queues on RabbitMQ",
		SilenceUsage: true,
	}
	// The URL is resolved when a command runs: a default read from the environment would be
	// printed, password and all, by --help.
	var (
		urls    []string
		timeout time.Duration
	)
	root.PersistentFlags().StringArrayVar(&urls, "url", nil, "broker URL; repeated, or separated by commas, for the nodes of a cluster (default "+urlDefault()+")")
	root.PersistentFlags().DurationVar(&timeout, "timeout", 30*time.Second, "time limit of the command, retries included")
	killer := func() (*router.Killer, error) {
		u := strings.Join(urls, ",")
		if u == "" {
			u = os.Getenv("WARREN_AMQP_URL")
		}
		if u == "" {
			u = defaultURL
		}
		if timeout <= 0 {
			return nil, fmt.Errorf("--timeout %s is not positive", timeout)
		}
		return router.NewKiller(router.KillerConfig{
			Connection:     warren.Connection{URL: u},
			KillSecret:     []byte(os.Getenv("WARREN_KILL_SECRET")),
			PublishTimeout: timeout,
		}, nil)
	}

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
			k, err := killer()
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

	resume := &cobra.Command{
		Use:   "resume QUEUE",
		Short: "Lift a kill: the consumers of QUEUE take messages again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := killer()
			if err != nil {
				return err
			}
			return report(cmd.OutOrStdout(), k.Resume(context.Background(), args[0]), router.Resume, args[0])
		},
	}
	root.AddCommand(kill, resume)
	return root
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

// urlDefault describes the default of --url, with the password of the URL in
// $WARREN_AMQP_URL replaced.
func urlDefault() string {
	if u := os.Getenv("WARREN_AMQP_URL"); u != "" {
		return "$WARREN_AMQP_URL: " + amqpurl.Redact(u)
	}
	return "$WARREN_AMQP_URL, else " + amqpurl.Redact(defaultURL)
}
