package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/outbox"
	"github.com/warrenmq/warren/topology"
)

// statusFlags are the flags of warren status.
type statusFlags struct {
	df     *delayFlags
	pf     *postgresFlags
	asJSON bool
	watch  time.Duration
}

func newStatus(g *globals) *cobra.Command {
	var f statusFlags
	status := &cobra.Command{
		Use:   "status [QUEUE...]",
		Short: "Show work queues (ready, consumers, kill state, poison) and the delay levels (waiting, parked)",
		Long: "Show, per work queue, the messages ready, its consumers, its remembered kill command and its\n" +
			"poison queue's depth; then the messages waiting in the delay levels (per level) and parked.\n" +
			"With --config FILE, the work queues of the topology file too. AMQP does not tell a queue's\n" +
			"state, its unacknowledged messages, nor the hosts of its consumers: with --management URL (or\n" +
			"$WARREN_MANAGEMENT_URL), RabbitMQ's management HTTP API does, a queue or level that is down\n" +
			"shows as down, and without QUEUE arguments status lists warren's work queues, the nodes'\n" +
			"resources and alarms, and the policies that change warren's queues. What is wrong comes\n" +
			"first, a line each (poison messages, no consumer, a queue down, a file handle, memory or disk\n" +
			"limit at 80%, an alarm, a policy). A broker version on which one malformed message can stop\n" +
			"dead-lettering is one of them, explained once on stderr. With --postgres URL (or\n" +
			"$WARREN_POSTGRES_URL) and --schema, the outbox too (package outbox): its rows waiting, the\n" +
			"oldest one's age (how far the relay lags), the relays connected, the inbox's keys and the\n" +
			"first rows set aside; a row set aside is a problem, and so is a database that cannot be\n" +
			"read (exit 1, once the rest is shown). With --watch D, again every D until interrupted.",
		RunE: func(cmd *cobra.Command, args []string) error { return g.status(cmd, args, &f) },
	}
	f.df = addDelayFlags(status.Flags())
	f.pf = addPostgresFlags(status.Flags(), "PostgreSQL URL of the outbox to show (default $WARREN_POSTGRES_URL; none: no outbox)")
	status.Flags().BoolVar(&f.asJSON, "json", false, "print JSON")
	status.Flags().DurationVar(&f.watch, "watch", 0, "show it again every this long, until interrupted (0: once)")
	return status
}

// status is warren status: it shows the status once, or with --watch again every --watch
// until interrupted.
func (g *globals) status(cmd *cobra.Command, args []string, f *statusFlags) error {
	cfg, err := f.df.config(g.timeout)
	if err != nil {
		return err
	}
	queues, err := f.df.workQueues(args)
	if err != nil {
		return err
	}
	var pg *pgx.ConnConfig // nil: no outbox section
	if f.pf.given() != "" {
		if pg, err = f.pf.config(); err != nil {
			return err
		}
	}
	o, err := g.ops(cmd, cfg.Delay)
	if err != nil {
		return err
	}
	defer o.Close()
	out := cmd.OutOrStdout()
	listed := len(queues) == 0 && g.managementURL() != ""
	warned := false // the version's hazard, told once on stderr
	for {
		if listed {
			if queues, err = o.WorkQueues(cmd.Context()); err != nil {
				return err
			}
		}
		s, err := o.Status(cmd.Context(), queues...)
		if err != nil {
			return err
		}
		var box *outboxSection
		if pg != nil {
			box = readOutbox(cmd.Context(), pg, f.pf.schema, g.timeout)
		}
		if f.asJSON {
			err = printJSON(out, statusJSON{Status: s, Outbox: box.json()})
		} else {
			if s.Warning != "" && !warned {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", s.Warning)
				warned = true
			}
			err = printStatus(out, s, cfg.Delay, listed, box)
		}
		if err != nil {
			return err
		}
		if f.watch <= 0 {
			if box != nil && box.err != nil { // as a management API that cannot be read
				return fmt.Errorf("outbox %s: cannot read PostgreSQL: %w", box.schema, box.err)
			}
			return missing(s)
		}
		select {
		case <-time.After(f.watch):
		case <-cmd.Context().Done():
			return nil
		}
		if !f.asJSON {
			fmt.Fprintln(out)
		}
	}
}

// missing is the error of a status that names work queues that do not exist (exit 2), nil if
// every one exists.
func missing(s ops.Status) error {
	var names []string
	for _, q := range s.Queues {
		if !q.Exists {
			names = append(names, q.Queue)
		}
	}
	if len(names) == 0 {
		return nil
	}
	return &exitError{exitNoQueue, fmt.Sprintf("no such queue: %s", strings.Join(names, ", ")), ops.ErrNoQueue}
}

// printStatus writes s, and the outbox if box is not nil.
func printStatus(out io.Writer, s ops.Status, d topology.Delay, listed bool, box *outboxSection) error {
	printProblems(out, s, box.problems()...)
	switch {
	case len(s.Queues) > 0:
		if err := printQueues(out, s); err != nil {
			return err
		}
	case listed:
		fmt.Fprintln(out, "no work queue of warren on the broker (the management API lists none)")
	default:
		fmt.Fprintln(out, "no work queue named: give their names (warren status QUEUE...), a topology file (--config FILE),\n"+
			"or the management API (--management URL or $WARREN_MANAGEMENT_URL) to list warren's work queues")
	}
	printDelayLevels(out, s.Delay, d)
	if box != nil {
		if err := box.print(out); err != nil {
			return err
		}
	}
	if !s.Management {
		fmt.Fprintln(out, "management API: not given (--management URL or $WARREN_MANAGEMENT_URL): no queue states, unacked messages, dead-lettering or consumers' hosts")
	}
	return nil
}

// printQueues writes the table of the work queues of s, with the columns of the management
// API when s has them.
func printQueues(out io.Writer, s ops.Status) error {
	now := s.At
	tw := newTable(out)
	if s.Management {
		fmt.Fprintln(tw, "QUEUE\tSTATE\tREADY\tUNACKED\tCONSUMERS\tKILL\tPOISON\tCONSUMER HOSTS")
	} else {
		fmt.Fprintln(tw, "QUEUE\tREADY\tCONSUMERS\tKILL\tPOISON")
	}
	for _, q := range s.Queues {
		if !q.Exists {
			if s.Management {
				fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t(no such queue)\n", q.Queue)
			} else {
				fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t(no such queue)\n", q.Queue)
			}
			continue
		}
		kill := "-"
		if q.Kill != "" {
			kill = fmt.Sprintf("%s (%s)", q.Kill, ago(q.KillAt, now))
		}
		poison := "-"
		if q.Poison >= 0 {
			poison = fmt.Sprint(q.Poison)
		}
		if !s.Management {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", q.Queue, q.Ready, q.Consumers, kill, poison)
			continue
		}
		ready, unacked, hosts := fmt.Sprint(q.Ready), fmt.Sprint(q.Unacked), strings.Join(q.ConsumerHosts, ", ")
		if q.Unavailable() { // the broker's 0 is no count
			ready, unacked = "-", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", q.Queue, q.State, ready, unacked, q.Consumers, kill, poison, cmp.Or(hosts, "-"))
	}
	return tw.Flush()
}

// printDelayLevels writes the line of the delay levels d (their status dl), and a line for
// each level that is not running, dead-letters or holds messages.
func printDelayLevels(out io.Writer, dl ops.DelayStatus, d topology.Delay) {
	if dl.Missing == len(dl.Levels) {
		fmt.Fprintf(out, "delay levels %s: not declared\n", dl.Name)
		return
	}
	var lines []string
	for _, l := range dl.Levels {
		level := fmt.Sprintf("%s (%s)", strings.TrimPrefix(l.Queue, d.Name()+"."), human(l.TTL))
		switch {
		case l.Unavailable():
			lines = append(lines, fmt.Sprintf("%s: %s, its messages uncounted", level, l.State))
		case l.DeadLettering > 0:
			lines = append(lines, fmt.Sprintf("%s: %d (%d dead-lettering)", level, l.Messages, l.DeadLettering))
		case l.Messages > 0:
			lines = append(lines, fmt.Sprintf("%s: %d", level, l.Messages))
		}
	}
	fmt.Fprintf(out, "delay levels %s: %d waiting, %d parked", dl.Name, dl.Waiting, max(dl.Parked, 0))
	if unavailable(dl.ParkingState) {
		fmt.Fprintf(out, " (parking queue %s)", dl.ParkingState)
	}
	if dl.DeadLettering > 0 {
		fmt.Fprintf(out, ", %d dead-lettering", dl.DeadLettering)
	}
	if dl.Unavailable > 0 {
		fmt.Fprintf(out, ", %d of %d level queues not running", dl.Unavailable, len(dl.Levels))
	}
	if dl.Missing > 0 {
		fmt.Fprintf(out, ", %d of %d level queues missing", dl.Missing, len(dl.Levels))
	}
	fmt.Fprintln(out)
	for _, l := range lines {
		fmt.Fprintln(out, "  "+l)
	}
}

// unavailable reports whether a queue state of ops.Status is known and not serving.
func unavailable(state string) bool {
	return ops.QueueStatus{State: state}.Unavailable()
}

// statusJSON is what status --json prints: ops.Status, and the outbox when --postgres
// names one.
type statusJSON struct {
	ops.Status
	Outbox *outboxJSON `json:"outbox,omitempty"`
}

// setAsideShown is how many rows set aside status lists, the oldest first.
const setAsideShown = 5

// problemOutbox is the ops.Problem Kind of what is wrong with the outbox.
const problemOutbox = "outbox"

// outboxSection is the outbox as status shows it: its figures and first rows set aside, or
// why they could not be read.
type outboxSection struct {
	schema string
	stats  outbox.Stats
	rows   []outbox.SetAsideRow
	err    error
}

// readOutbox reads the outbox of schema in the database of cfg, within timeout.
func readOutbox(ctx context.Context, cfg *pgx.ConnConfig, schema string, timeout time.Duration) *outboxSection {
	box := &outboxSection{schema: cmp.Or(schema, outbox.DefaultSchema)}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		box.err = fmt.Errorf("connect: %w", err)
		return box
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if box.stats, box.err = outbox.ReadStats(ctx, conn, schema); box.err != nil {
		return box
	}
	if box.stats.SetAside > 0 {
		box.rows, box.err = outbox.ListSetAside(ctx, conn, schema, setAsideShown)
	}
	return box
}

// problems lists what is wrong with the outbox: it cannot be read, rows are set aside, rows
// wait and no relay is connected. None for a nil box.
func (box *outboxSection) problems() []ops.Problem {
	if box == nil {
		return nil
	}
	texts := box.stats.Problems()
	if box.err != nil {
		texts = []string{"cannot read PostgreSQL"}
	}
	ps := make([]ops.Problem, len(texts))
	for i, t := range texts {
		ps[i] = ops.Problem{Kind: problemOutbox, Text: "outbox " + box.schema + ": " + t}
	}
	return ps
}

// print writes the outbox's section of status.
func (box *outboxSection) print(out io.Writer) error {
	if box.err != nil {
		fmt.Fprintf(out, "outbox %s: cannot read PostgreSQL: %v\n", box.schema, box.err)
		return nil
	}
	printOutboxStats(out, box.stats, " (below; warren outbox replay once mended)")
	if len(box.rows) == 0 {
		return nil
	}
	if err := printSetAside(out, box.rows, 100); err != nil {
		return err
	}
	if more := box.stats.SetAside - int64(len(box.rows)); more > 0 {
		fmt.Fprintf(out, "and %d more (warren outbox set-aside)\n", more)
	}
	return nil
}

// json is the outbox as status --json prints it; nil for a nil box.
func (box *outboxSection) json() *outboxJSON {
	if box == nil {
		return nil
	}
	if box.err != nil {
		return &outboxJSON{Schema: box.schema, Error: "cannot read PostgreSQL: " + box.err.Error()}
	}
	return &outboxJSON{Schema: box.stats.Schema, outboxFigures: figures(box.stats), SetAsideRows: box.rows}
}
