package main

import (
	"cmp"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

func newStatus(g *globals) *cobra.Command {
	var (
		df     *delayFlags
		asJSON bool
		watch  time.Duration
	)
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
			"dead-lettering is one of them, explained once on stderr. With --watch D, again every D until\n" +
			"interrupted.",
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := df.config(g.timeout)
			if err != nil {
				return err
			}
			queues, err := df.workQueues(args)
			if err != nil {
				return err
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
				if asJSON {
					err = printJSON(out, s)
				} else {
					if s.Warning != "" && !warned {
						fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", s.Warning)
						warned = true
					}
					err = printStatus(out, s, cfg.Delay, listed)
				}
				if err != nil {
					return err
				}
				if watch <= 0 {
					return missing(s)
				}
				select {
				case <-time.After(watch):
				case <-cmd.Context().Done():
					return nil
				}
				if !asJSON {
					fmt.Fprintln(out)
				}
			}
		},
	}
	df = addDelayFlags(status.Flags())
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	status.Flags().DurationVar(&watch, "watch", 0, "show it again every this long, until interrupted (0: once)")
	return status
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

func printStatus(out io.Writer, s ops.Status, d topology.Delay, listed bool) error {
	now := s.At
	printProblems(out, s)
	switch {
	case len(s.Queues) > 0:
	case listed:
		fmt.Fprintln(out, "no work queue of warren on the broker (the management API lists none)")
	default:
		fmt.Fprintln(out, "no work queue named: give their names (warren status QUEUE...), a topology file (--config FILE),\n"+
			"or the management API (--management URL or $WARREN_MANAGEMENT_URL) to list warren's work queues")
	}
	if len(s.Queues) > 0 {
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
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	dl := s.Delay
	if dl.Missing == len(dl.Levels) {
		fmt.Fprintf(out, "delay levels %s: not declared\n", dl.Name)
	} else {
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
	if !s.Management {
		fmt.Fprintln(out, "management API: not given (--management URL or $WARREN_MANAGEMENT_URL): no queue states, unacked messages, dead-lettering or consumers' hosts")
	}
	return nil
}

// unavailable reports whether a queue state of ops.Status is known and not serving.
func unavailable(state string) bool {
	return ops.QueueStatus{State: state}.Unavailable()
}
