// Command warren is the ops CLI of warren.
//
//	warren kill QUEUE [--delete] [--force] [--wait 5s] [--json]   stop every consumer of QUEUE, in every process
//	warren resume QUEUE [--force] [--wait 5s] [--json]            let them consume again
//	warren topology apply|verify|diagram FILE   declare, check or draw a topology file
//	warren delays apply|verify|remove           the delay levels alone
//	warren publish TOPIC [--delay D|--at T]     publish one message, with a confirm
//	warren status [QUEUE...] [--watch D]        queues, kill state, poison, delay levels; the outbox (--postgres URL)
//	warren poison list|replay|export|purge QUEUE  the poison queue of QUEUE
//	warren parked list|replay                   delayed messages whose destination was gone
//	warren ui [--listen ADDR] [--allow-actions]  the dashboard, in a browser, under /warren/ (the outbox: --postgres URL)
//	warren scheduled list|cancel                messages published with a schedule id (the ledger)
//	warren schedules list [GROUP]               a scheduler group's jobs; without GROUP, the groups
//	warren outbox migrate|status|set-aside|replay  the outbox on PostgreSQL (--postgres URL)
//	warren completion bash|zsh|fish             shell completion
//
// kill and resume refuse a queue that does not exist (unless --force), and wait up to --wait
// until every consumer the broker counts has confirmed, printing e.g. "stop confirmed by 3
// consumers in 2 processes within 12ms (the queue had 3 consumers)"; --json prints the result
// as JSON.
//
// The broker is --url (repeated, or separated by commas, for the nodes of a cluster), else
// $WARREN_AMQP_URL (comma-separated), else the local one (guest); no output shows a password.
// --timeout (default 30s) bounds each command. Connecting is bounded by --connect-timeout
// (default 5s, a person waits for it; per node of --url): a node that is down or does not
// answer, or a host that is not found, is retried until then, and the error names each node
// tried (its URL without the password) and its last failure ("connect: gave up after 5s:
// amqp://guest:xxxxx@127.0.0.1:5999/: dial tcp 127.0.0.1:5999: connect: connection
// refused"). What retrying cannot change fails at once, with the broker's reason: a wrong
// user or password (after about 3s: RabbitMQ's pause before it closes a refused login), a
// vhost that does not exist or that the user may not use, a certificate that fails
// verification.
//
// status reads RabbitMQ's management HTTP API too when --management or
// $WARREN_MANAGEMENT_URL gives it (http://user:password@host:15672/), and so does delays
// verify; ui and schedules list list the work queues and the scheduler groups with it.
//
// status and ui show the outbox on PostgreSQL (package outbox) when --postgres or
// $WARREN_POSTGRES_URL names its database, --schema its schema, as `warren outbox` does.
//
// The kill secret, when consumers require signed commands, is read from $WARREN_KILL_SECRET
// (never from the command line, where other users of the machine could see it).
//
// No value read from the broker reaches a terminal as it is: every table and message shows a
// control character visibly (C0 as \x1b, DEL and C1 as \u007f, \u009b, a byte that is not
// UTF-8 as \xff); --json and export keep every value exact (JSON's own escapes).
//
// Exit codes, the same for every command:
//
//	0  done; kill and resume with no consumer listening too (a warning: the command is
//	   remembered for consumers that start later)
//	1  an error, printed on stderr: a bad flag or argument, a broker that refused or could
//	   not be reached, a failed check (verify), a refused replay destination (a poison or
//	   parking queue), a purge not confirmed
//	2  not found: a queue, exchange or delay levels the command names do not exist, and
//	   nothing was done (kill and resume declare and send nothing; status names one queue
//	   that does not exist; a replay left every selected message because its destination
//	   does not exist)
//	3  done in part: kill or resume sent, but not confirmed by every consumer within --wait
//	   (some refused it, or did not answer); a replay that left some selected messages
//	   behind
//
// `go run` turns every exit code but 0 into 1: scripts that read it run the installed
// command (go install github.com/warrenmq/warren/cmd/warren@latest).
//
// docs/topology.md (topology, delays, publish), docs/operating.md (status, poison, parked,
// exit codes) and docs/kill.md (kill, resume) show each command at work.
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
	urls           []string
	timeout        time.Duration
	connectTimeout time.Duration
	management     string
}

// managementURL is the management HTTP API the flags and environment name: --management,
// else $WARREN_MANAGEMENT_URL; "" for none. Resolved when a command runs, as the broker URL.
func (g *globals) managementURL() string {
	if g.management != "" {
		return g.management
	}
	return os.Getenv("WARREN_MANAGEMENT_URL")
}

// connection is the broker the flags and environment name, with --connect-timeout per node
// as its ConnectTimeout. The URL is resolved when a command runs: a default read from the
// environment would be printed, password and all, by --help.
func (g *globals) connection() (warren.Connection, error) {
	u := strings.Join(g.urls, ",")
	if u == "" {
		u = os.Getenv("WARREN_AMQP_URL")
	}
	if u == "" {
		u = defaultURL
	}
	if g.timeout <= 0 {
		return warren.Connection{}, fmt.Errorf("--timeout %s is not positive", human(g.timeout))
	}
	if g.connectTimeout <= 0 {
		return warren.Connection{}, fmt.Errorf("--connect-timeout %s is not positive", g.connectTimeout)
	}
	// Dial gives each node an equal share of the time: each gets --connect-timeout, enough
	// for RabbitMQ's refusal of a login, which comes after about 3s.
	c := warren.Connection{URL: u, ConnectTimeout: g.connectTimeout * time.Duration(len(amqpurl.Split(u)))}
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
		Use:   "warren",
		Short: "Operate warren's queues on RabbitMQ",
		Long: "Operate warren's queues on RabbitMQ.\n\n" +
			"Exit codes, the same for every command: 0 done, 1 an error, 2 not found (a queue, exchange or delay\n" +
			"levels the command names do not exist; nothing was done), 3 done in part.",
		SilenceUsage: true,
		// Every command's output passes through visible (see safeOutput).
		PersistentPreRun: safeOutput,
	}
	root.SetOut(safe(os.Stdout)) // and the errors of flags and arguments, before PersistentPreRun
	root.SetErr(safe(os.Stderr))
	g := &globals{}
	root.PersistentFlags().StringArrayVar(&g.urls, "url", nil, "broker URL; repeated, or separated by commas, for the nodes of a cluster (default "+urlDefault()+")")
	root.PersistentFlags().DurationVar(&g.timeout, "timeout", 30*time.Second, "time limit of the command, retries included")
	root.PersistentFlags().DurationVar(&g.connectTimeout, "connect-timeout", 5*time.Second,
		"time limit of connecting, retries included, per node of --url; a refused login, unknown vhost or untrusted certificate fails at once")
	root.PersistentFlags().StringVar(&g.management, "management", "", "URL of RabbitMQ's management HTTP API with a user, e.g. http://guest:guest@127.0.0.1:15672/, for status, delays verify, ui and schedules list ("+managementDefault()+")")
	root.AddCommand(newKill(g), newResume(g))
	root.AddCommand(newTopology(g), newDelays(g), newPublish(g))
	root.AddCommand(newStatus(g), newPoison(g), newHeld(g), newParked(g), newUI(g), newSchedules(g), newScheduled(g), newOutbox(g))
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
