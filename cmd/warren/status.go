package main

import (
	"fmt"
	"io"
	"slices"
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
			"With --config FILE, the work queues of the topology file too. AMQP does not tell how many\n" +
			"messages are delivered and unacknowledged: `rabbitmqctl list_queues name messages_unacknowledged`\n" +
			"does. With --watch D, again every D until interrupted.",
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := df.config(g.timeout)
			if err != nil {
				return err
			}
			queues := args
			if df.file != "" {
				file, err := topology.Load(df.file)
				if err != nil {
					return fmt.Errorf("--config: %w", err)
				}
				for _, q := range file.Queues {
					if !slices.Contains(queues, q.Name) {
						queues = append(queues, q.Name)
					}
				}
			}
			o, err := g.ops(cmd, cfg.Delay)
			if err != nil {
				return err
			}
			defer o.Close()
			out := cmd.OutOrStdout()
			for {
				s, err := o.Status(cmd.Context(), queues...)
				if err != nil {
					return err
				}
				if asJSON {
					err = printJSON(out, s)
				} else {
					err = printStatus(out, s, cfg.Delay)
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

func printStatus(out io.Writer, s ops.Status, d topology.Delay) error {
	now := s.At
	if len(s.Queues) > 0 {
		tw := newTable(out)
		fmt.Fprintln(tw, "QUEUE\tREADY\tCONSUMERS\tKILL\tPOISON")
		for _, q := range s.Queues {
			if !q.Exists {
				fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t(no such queue)\n", q.Queue)
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
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", q.Queue, q.Ready, q.Consumers, kill, poison)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	dl := s.Delay
	if dl.Missing == len(dl.Levels) {
		_, err := fmt.Fprintf(out, "delay levels %s: not declared\n", dl.Name)
		return err
	}
	var waiting []string
	for _, l := range dl.Levels {
		if l.Messages > 0 {
			waiting = append(waiting, fmt.Sprintf("%s (%s): %d", strings.TrimPrefix(l.Queue, d.Name()+"."), human(l.TTL), l.Messages))
		}
	}
	fmt.Fprintf(out, "delay levels %s: %d waiting, %d parked", dl.Name, dl.Waiting, max(dl.Parked, 0))
	if dl.Missing > 0 {
		fmt.Fprintf(out, ", %d of %d level queues missing", dl.Missing, len(dl.Levels))
	}
	fmt.Fprintln(out)
	for _, w := range waiting {
		fmt.Fprintln(out, "  "+w)
	}
	return nil
}
