// Command warren is the ops CLI of warren.
//
//	warren kill QUEUE [--delete] [--force] [--wait 5s] [--json]   stop every consumer of QUEUE, in every process
//	warren resume QUEUE [--force] [--wait 5s] [--json]            let them consume again
//	warren topology apply|verify|diagram FILE   declare, check or draw a topology file
//	warren delays apply|verify|remove           the delay levels alone
//	warren publish TOPIC [--delay D|--at T]     publish one message, with a confirm
//	warren status [QUEUE...] [--watch D]        queues, kill state, poison, delay levels
//	warren poison list|replay|export|purge QUEUE  the poison queue of QUEUE
//	warren parked list|replay                   delayed messages whose destination was gone
//
// kill and resume refuse a queue that does not exist (unless --force), and wait up to --wait
// for the consumers to confirm, printing e.g. "stop confirmed by 3 consumers in 2 processes
// within 12ms (the queue had 3 consumers)"; --json prints the result as JSON.
//
// The broker is --url (repeated, or separated by commas, for the nodes of a cluster), else
// $WARREN_AMQP_URL (comma-separated), else the local one (guest); no output shows a password.
// status reads RabbitMQ's management HTTP API too when --management or
// $WARREN_MANAGEMENT_URL gives it (http://user:password@host:15672/).
// --timeout (default 30s) bounds each command. The kill secret, when consumers require signed
// commands, is read from $WARREN_KILL_SECRET (never from the command line, where other users
// of the machine could see it).
//
// Exit codes: 0 success, 1 an error (printed on stderr), 2 a queue that does not exist (kill
// and resume sent nothing; poison commands found no poison queue), 3 done in part: kill or
// resume was sent but not every consumer confirmed it within --wait (some refused it, or did
// not answer), or a replay left selected messages behind. No consumer listening is a warning
// (0): the command is remembered for consumers that start later.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/spf13/cobra"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpurl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	os.Exit(exitCode(err))
}

// defaultURL is the broker when neither --url nor $WARREN_AMQP_URL says otherwise.
const defaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// globals are the flags every command shares.
type globals struct {
	urls       []string
	timeout    time.Duration
	management string
}

// managementURL is the management HTTP API the flags and environment name: --management,
// else $WARREN_MANAGEMENT_URL; "" for none. Resolved when a command runs, as the broker URL.
func (g *globals) managementURL() string {
	if g.management != "" {
		return g.management
	}
	return os.Getenv("WARREN_MANAGEMENT_URL")
}

// connection is the broker the flags and environment name. The URL is resolved when a
// command runs: a default read from the environment would be printed, password and all, by
// --help.
func (g *globals) connection() (warren.Connection, error) {
	u := strings.Join(g.urls, ",")
	if u == "" {
		u = os.Getenv("WARREN_AMQP_URL")
	}
	if u == "" {
		u = defaultURL
	}
	if g.timeout <= 0 {
		return warren.Connection{}, fmt.Errorf("--timeout %s is not positive", g.timeout)
	}
	c := warren.Connection{URL: u}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("--url: %w", err)
	}
	return c, nil
}

// logger tells the user, on stderr, what warren's components log with an error: a broker
// call that failed and is retried (else a refused port is silent until --timeout). Progress
// ("Broker connected") and debug lines are left out.
func logger(cmd *cobra.Command) watermill.LoggerAdapter {
	return stderrLogger{watermill.NewStdLoggerWithOut(cmd.ErrOrStderr(), false, false)}
}

// stderrLogger passes on the Info lines that carry an "err" field, and every Error line.
type stderrLogger struct{ watermill.LoggerAdapter }

func (l stderrLogger) Info(msg string, fields watermill.LogFields) {
	if _, ok := fields["err"]; ok {
		l.LoggerAdapter.Info(msg, fields)
	}
}

func (l stderrLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return stderrLogger{l.LoggerAdapter.With(fields)}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:          "warren",
		Short:        "Operate warren's queues on RabbitMQ",
		SilenceUsage: true,
	}
	g := &globals{}
	root.PersistentFlags().StringArrayVar(&g.urls, "url", nil, "broker URL; repeated, or separated by commas, for the nodes of a cluster (default "+urlDefault()+")")
	root.PersistentFlags().DurationVar(&g.timeout, "timeout", 30*time.Second, "time limit of the command, retries included")
	root.PersistentFlags().StringVar(&g.management, "management", "", "URL of RabbitMQ's management HTTP API with a user, e.g. http://guest:guest@127.0.0.1:15672/, for status ("+managementDefault()+")")
	root.AddCommand(newKill(g), newResume(g))
	root.AddCommand(newTopology(g), newDelays(g), newPublish(g))
	root.AddCommand(newStatus(g), newPoison(g), newParked(g))
	return root
}

// managementDefault describes the default of --management, with the password of the URL in
// $WARREN_MANAGEMENT_URL replaced.
func managementDefault() string {
	if u := os.Getenv("WARREN_MANAGEMENT_URL"); u != "" {
		return "default $WARREN_MANAGEMENT_URL: " + amqpurl.Redact(u)
	}
	return "default $WARREN_MANAGEMENT_URL; none if unset"
}

// urlDefault describes the default of --url, with the password of the URL in
// $WARREN_AMQP_URL replaced.
func urlDefault() string {
	if u := os.Getenv("WARREN_AMQP_URL"); u != "" {
		return "$WARREN_AMQP_URL: " + amqpurl.Redact(u)
	}
	return "$WARREN_AMQP_URL, else " + amqpurl.Redact(defaultURL)
}
