package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

// quorumQueues lists the quorum queues that declaring t and the delay levels of b creates:
// each quorum work queue and its poison queue, and the level, chain and parking queues when
// the levels are quorum ones.
func quorumQueues(b *topology.Builder, t topology.Topology) []string {
	var names []string
	d := b.Delay()
	if !d.Disabled && d.WithDefaults().QueueType == topology.Quorum {
		names, _ = d.Names()
	}
	for _, q := range t.Queues {
		if b.QueueType(q) == topology.Quorum {
			names = append(names, q.Name, topology.PoisonQueue(q.Name))
		}
	}
	return names
}

// commonHandles is the file handle limit of a RabbitMQ 3.x node with the common default of
// 1,024 open files. Without the management API, an apply whose quorum queues would take a
// quarter of it says that the node's limit is unchecked.
const commonHandles = 927

// checkFileHandles tells, on stderr, what declaring the quorum queues named would do to the
// file handles of a RabbitMQ 3.x broker (ops.CheckFileHandles), and refuses, unless force,
// when they would take a node past its limit: it would then stop answering connections,
// for every client. Without the management API it says that the limit is unchecked, when
// the queues are many (see commonHandles).
func (g *globals) checkFileHandles(cmd *cobra.Command, d topology.Delay, queues []string, force bool) error {
	if len(queues) == 0 {
		return nil
	}
	o, err := g.ops(cmd, d)
	if err != nil {
		return err
	}
	defer o.Close()
	c, err := o.CheckFileHandles(cmd.Context(), queues)
	if err != nil || !c.Cache {
		return err
	}
	stderr := cmd.ErrOrStderr()
	if c.New < 0 {
		if ops.FileHandlesPerQuorumQueue*len(queues) < commonHandles/4 {
			return nil // too few to matter even on a node with the common limit
		}
		fmt.Fprintf(stderr, "note: RabbitMQ %s holds %d file handles per quorum queue, and this declares up to %d of them; "+
			"its open-file limit is unchecked: give --management URL (or $WARREN_MANAGEMENT_URL) to check it first\n",
			c.ServerVersion, ops.FileHandlesPerQuorumQueue, len(queues))
		return nil
	}
	for _, w := range c.Warnings {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	if c.Exhausts && !force {
		return fmt.Errorf("refused: declaring %d quorum queues would exhaust the file handles of RabbitMQ %s "+
			"(see the warning above); nothing declared; raise the node's open-file limit, or --force", c.New, c.ServerVersion)
	}
	return nil
}

// fewItems is how many names a line of problems lists before it counts the rest.
const fewItems = 3

// printProblems writes the problems of s (ops.Status.Problems) and then extra, a line each,
// a problem that several work queues share on one line naming a few of them; nothing when
// there is none.
func printProblems(out io.Writer, s ops.Status, extra ...ops.Problem) {
	ps := append(s.Problems(), extra...)
	if len(ps) == 0 {
		return
	}
	var texts []string
	queues := map[string][]string{}
	for _, p := range ps {
		text := p.Text
		if p.Queue != "" {
			if _, seen := queues[text]; !seen {
				texts = append(texts, text)
			}
			queues[text] = append(queues[text], p.Queue)
			continue
		}
		texts = append(texts, text)
	}
	fmt.Fprintf(out, "%s:\n", plural(len(ps), "problem"))
	for _, text := range texts {
		qs, ok := queues[text]
		switch {
		case !ok:
			fmt.Fprintf(out, "  %s\n", text)
		case len(qs) == 1:
			fmt.Fprintf(out, "  %s: %s\n", qs[0], text)
		default:
			names := strings.Join(qs[:min(len(qs), fewItems)], ", ")
			if len(qs) > fewItems {
				names += fmt.Sprintf(" and %d more", len(qs)-fewItems)
			}
			fmt.Fprintf(out, "  %s: %s\n", text, names)
		}
	}
}
