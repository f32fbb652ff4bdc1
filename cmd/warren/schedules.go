package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/internal/amqpurl"
	"github.com/warrenmq/warren/internal/mgmt"
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
		Long: "List the jobs of scheduler group GROUP as its active scheduler last recorded them: each job's\n" +
			"schedule, topic and latest tick published (which waits in the delay levels until it is due),\n" +
			"and the ticks it missed; and how many schedulers take part (one of them active). It only\n" +
			"reads: it does not take part in the group.\n\n" +
			"Without GROUP it lists the groups, with how many schedulers take part and jobs: the queues\n" +
			"PREFIX.GROUP.lock that have a PREFIX.GROUP.state beside them, which only the management API\n" +
			"(--management) can list. A scheduler without scheduler.Config.Name is in group \"default\".",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return listGroups(cmd, g, prefix, asJSON)
			}
			name := args[0]
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
	list.Flags().StringVar(&prefix, "prefix", scheduler.DefaultPrefix, "first part of the names of the groups' queues")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	schedules.AddCommand(list)
	return schedules
}

// schedulerGroup is a group of schedulers that listGroups found.
type schedulerGroup struct {
	Name string `json:"name"`
	// Schedulers is how many schedulers take part (consumers of the lock queue).
	Schedulers int `json:"schedulers"`
	// Jobs is how many jobs the group's state records.
	Jobs int `json:"jobs"`
}

// listGroups prints the scheduler groups of prefix that the management API lists: a group's
// lock queue is prefix.NAME.lock, with a single active consumer, beside its state queue
// prefix.NAME.state (scheduler.LockQueue, scheduler.StateQueue). AMQP cannot list queues:
// without the management API it says so.
func listGroups(cmd *cobra.Command, g *globals, prefix string, asJSON bool) error {
	u := g.managementURL()
	if u == "" {
		return fmt.Errorf("name the group (warren schedules list GROUP; a scheduler without scheduler.Config.Name is in group %q): "+
			"only the management API lists the groups (--management or $WARREN_MANAGEMENT_URL)", scheduler.DefaultName)
	}
	m, err := mgmt.New(u)
	if err != nil {
		return fmt.Errorf("--management: %w", err)
	}
	defer m.Close()
	conn, err := g.connection()
	if err != nil {
		return err
	}
	vhost := "/"
	if uri, err := amqp.ParseURI(amqpurl.Split(conn.URL)[0]); err == nil {
		vhost = uri.Vhost
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	defer cancel()
	queues, err := m.Queues(ctx, vhost)
	if err != nil {
		return fmt.Errorf("list the scheduler groups: %w", err)
	}
	groups := groupsOf(queues, prefix)
	// The counts from AMQP: the management API's lag behind by its statistics interval.
	err = g.onBroker(cmd, "read the scheduler groups", func(ctx context.Context, conn *amqp.Connection) error {
		for i, grp := range groups {
			st, _, err := scheduler.ReadGroup(ctx, conn, prefix, grp.Name)
			if err != nil {
				return err
			}
			groups[i].Schedulers, groups[i].Jobs = st.Schedulers, len(st.Jobs)
		}
		return nil
	})
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if asJSON {
		return printJSON(out, groups)
	}
	if len(groups) == 0 {
		fmt.Fprintf(out, "no scheduler group: no queue %s\n", scheduler.LockQueue(prefix, "GROUP"))
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tSCHEDULERS\tJOBS")
	for _, grp := range groups {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", grp.Name, grp.Schedulers, grp.Jobs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "warren schedules list GROUP lists a group's jobs")
	return nil
}

// groupsOf returns the scheduler groups of prefix among queues, sorted by name.
func groupsOf(queues []mgmt.Queue, prefix string) []schedulerGroup {
	names := map[string]bool{}
	for _, q := range queues {
		names[q.Name] = true
	}
	groups := []schedulerGroup{}
	for _, q := range queues {
		name, ok := strings.CutPrefix(q.Name, prefix+".")
		if !ok {
			continue
		}
		name, ok = strings.CutSuffix(name, ".lock")
		// A single active consumer: not the lock of a work queue's kill state (Q.kill.lock).
		if sac, _ := q.Arguments["x-single-active-consumer"].(bool); !ok || !sac || name == "" || !names[scheduler.StateQueue(prefix, name)] {
			continue
		}
		groups = append(groups, schedulerGroup{Name: name})
	}
	slices.SortFunc(groups, func(a, b schedulerGroup) int { return strings.Compare(a.Name, b.Name) })
	return groups
}
