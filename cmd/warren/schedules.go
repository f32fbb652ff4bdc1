package main

import (
	"context"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/scheduler"
)

func newSchedules(g *globals) *cobra.Command {
	schedules := &cobra.Command{Use: "schedules", Short: "Show the recurring jobs of a group of schedulers"}
	var (
		prefix string
		asJSON bool
	)
	list := &cobra.Command{
		Use:   "list [GROUP]",
		Short: "List a scheduler group's jobs: schedule, topic, next tick; and how many schedulers take part",
		Long: "List the jobs of scheduler group GROUP (default \"default\") as its active scheduler last\n" +
			"recorded them: each job's schedule, topic and latest tick published (which waits in the delay\n" +
			"levels until it is due), and the ticks it missed; and how many schedulers take part (one of\n" +
			"them active). It only reads: it does not take part in the group.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := scheduler.DefaultName
			if len(args) == 1 {
				name = args[0]
			}
			var (
				grp   scheduler.Group
				found bool
			)
			err := g.onBroker(cmd, "read scheduler group "+name, func(ctx context.Context, conn *amqp.Connection) (err error) {
				grp, found, err = scheduler.ReadGroup(ctx, conn, prefix, name)
				return err
			})
			if err != nil {
				return err
			}
			if !found {
				return &exitError{exitNoQueue, fmt.Sprintf("no scheduler group %q: its lock queue %s does not exist", name,
					scheduler.LockQueue(prefix, name)), nil}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return printJSON(out, grp)
			}
			fmt.Fprintf(out, "group %s: %s taking part", name, plural(grp.Schedulers, "scheduler"))
			if !grp.At.IsZero() {
				fmt.Fprintf(out, "; state written %s by %s", grp.At.UTC().Format(time.RFC3339), grp.By)
			}
			fmt.Fprintln(out)
			if len(grp.Jobs) == 0 {
				fmt.Fprintln(out, "no jobs recorded yet")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "JOB\tSCHEDULE\tTOPIC\tNEXT TICK\tMISSED")
			names := make([]string, 0, len(grp.Jobs))
			for n := range grp.Jobs {
				names = append(names, n)
			}
			slices.Sort(names)
			now := time.Now()
			for _, n := range names {
				j := grp.Jobs[n]
				next := j.Next.UTC().Format(time.RFC3339)
				if j.Next.After(now) {
					next += " (in " + human(j.Next.Sub(now).Round(time.Second)) + ")"
				} else {
					next += " (" + human(now.Sub(j.Next).Round(time.Second)) + " ago: no scheduler active since)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", n, j.Schedule, j.Topic, next, j.Missed)
			}
			return tw.Flush()
		},
	}
	list.Flags().StringVar(&prefix, "prefix", scheduler.DefaultPrefix, "first part of the names of the group's queues")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	schedules.AddCommand(list)
	return schedules
}
