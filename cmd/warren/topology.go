package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/topology"
)

func newTopology(g *globals) *cobra.Command {
	top := &cobra.Command{
		Use:   "topology",
		Short: "Declare, verify or draw a topology file (YAML or JSON, see topology.File)",
		Long: "A topology file holds a topology.Topology (exchanges, queues, bindings) and, under config:, the\n" +
			"topology.Config it is declared with (queue type, delivery limit, delay levels), with snake_case keys:\n" +
			"the same model that services declare in Go. See examples/topology/topology.yaml.",
	}
	top.AddCommand(newTopologyApply(g), newTopologyVerify(g), newTopologyDiagram())
	return top
}

// builder loads the topology file at path and returns it with a Builder of its Config,
// each broker call bounded by --timeout.
func (g *globals) builder(cmd *cobra.Command, path string) (topology.File, *topology.Builder, error) {
	f, err := topology.Load(path)
	if err != nil {
		return f, nil, err
	}
	cfg := f.Config
	cfg.Timeout = g.timeout
	b, err := topology.NewBuilder(cfg, logger(cmd))
	return f, b, err
}

func newTopologyApply(g *globals) *cobra.Command {
	var force bool
	apply := &cobra.Command{
		Use:   "apply FILE",
		Short: "Declare the topology of FILE and its delay levels (idempotent)",
		Long: "Declare the delay levels and everything FILE lists: exchanges, work queues with their poison queues\n" +
			"and kill exchanges, bindings. What exists already with the same arguments is left as it is; what\n" +
			"exists with other arguments is an error naming the argument and what to do. FILE is checked before\n" +
			"anything is declared: a field a queue's type would ignore, or a binding to an exchange or queue that\n" +
			"FILE does not declare and the broker does not have, is an error and nothing is declared. On\n" +
			"RabbitMQ 3.x, each quorum queue holds 3 of the node's file handles, and a node out of them stops\n" +
			"answering connections: with --management URL (or $WARREN_MANAGEMENT_URL), apply first estimates\n" +
			"what the new queues take, warns at 80% of a node's limit, and refuses past it, unless --force.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, b, err := g.builder(cmd, args[0])
			if err != nil {
				return err
			}
			conn, err := g.connection()
			if err != nil {
				return err
			}
			if err := g.checkFileHandles(cmd, b.Delay(), quorumQueues(b, f.Topology), force); err != nil {
				return err
			}
			if err := b.Apply(cmd.Context(), conn, f.Topology); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied %s: %s, %s (each with its poison queue and kill exchange), %s; %s\n",
				args[0], plural(len(f.Exchanges), "exchange"), plural(len(f.Queues), "work queue"), plural(len(f.Bindings), "binding"),
				describeDelay(b.Delay()))
			return nil
		},
	}
	apply.Flags().BoolVar(&force, "force", false, "declare even though the new quorum queues would exhaust a RabbitMQ 3.x node's file handles")
	return apply
}

func newTopologyVerify(g *globals) *cobra.Command {
	var f verifyFlags
	verify := &cobra.Command{
		Use:   "verify FILE",
		Short: "Check that the broker has the topology of FILE, declaring nothing; exit 1 if not",
		Long: "List the exchanges and queues of FILE (and of its delay levels) that are missing (how many, when\n" +
			"there are more than 10; -v lists each), and those that exist with other arguments, naming the\n" +
			"argument. Check FILE itself first: a binding to an exchange or queue that FILE does not declare must\n" +
			"name one that exists on the broker. Bindings cannot be checked (AMQP 0-9-1 has no way to ask).\n" +
			"Exits 1 unless nothing is missing, nothing differs and every binding's names exist.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			file, b, err := g.builder(cmd, args[0])
			if err != nil {
				return err
			}
			return g.verify(cmd, b, file.Topology, args[0], "`warren topology apply "+args[0]+"`", f)
		},
	}
	f.register(verify)
	return verify
}

func newTopologyDiagram() *cobra.Command {
	var format string
	diagram := &cobra.Command{
		Use:   "diagram FILE",
		Short: "Draw the topology of FILE as a Mermaid flowchart or a Graphviz DOT graph",
		Long: "Draw FILE's exchanges, queues and bindings with what declaring them adds: each work queue's poison\n" +
			"queue and kill exchange, and the delay levels (one node) with their delivery exchange and parking\n" +
			"queue. Needs no broker. `warren topology diagram FILE --format dot | dot -Tsvg > topology.svg`.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			draw := map[string]func(topology.Config, topology.Topology) string{"mermaid": topology.Mermaid, "dot": topology.DOT}[format]
			if draw == nil {
				return fmt.Errorf("--format %q is neither mermaid nor dot", format)
			}
			f, err := topology.Load(args[0])
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), draw(f.Config, f.Topology))
			return err
		},
	}
	diagram.Flags().StringVar(&format, "format", "mermaid", "mermaid or dot")
	return diagram
}

// describeDelay says which delay levels d is, or that there are none.
func describeDelay(d topology.Delay) string {
	if d.Disabled {
		return "no delay levels (disabled)"
	}
	chain := ""
	if n := d.Chain(); n > 0 {
		chain = fmt.Sprintf(", a chain of %d", n)
	}
	return fmt.Sprintf("delay levels %s (%s: %s, radix %d, unit %s%s; delays up to %s)",
		d.Name(), plural(d.QueueCount(), string(d.QueueType)+" queue"), plural(d.Levels, "level"), d.Radix, human(d.Unit), chain, human(d.Max()))
}
