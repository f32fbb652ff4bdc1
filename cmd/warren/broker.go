package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/topology"
)

// onBroker connects to the broker of g and runs op on the connection. A failure to connect
// is retried until --connect-timeout, a lost connection until --timeout (what says what was
// attempted; each failed attempt is logged once, by the retry); a broker refusal is not
// retried.
func (g *globals) onBroker(cmd *cobra.Command, what string, op func(ctx context.Context, conn *amqp.Connection) error) error {
	c, err := g.connection()
	if err != nil {
		return err
	}
	return amqpx.NewDialer(c, "warren cli", logger(cmd)).OwnerReportsLoss().Run(cmd.Context(), g.timeout, what, op)
}

// verifyFlags are the flags of topology verify and delays verify.
type verifyFlags struct {
	asJSON, verbose bool
}

func (f *verifyFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print the report as JSON")
	cmd.Flags().BoolVarP(&f.verbose, "verbose", "v", false, "list every missing exchange and queue (else, when many are, how many)")
}

// verify prints the Report of b.Verify(t), as text or as JSON, and returns an error naming
// what when it is not OK. apply is the command that declares what is missing.
func (g *globals) verify(cmd *cobra.Command, b *topology.Builder, t topology.Topology, what, apply string, f verifyFlags) error {
	conn, err := g.connection()
	if err != nil {
		return err
	}
	conn.ConnectTimeout = min(conn.ConnectTimeout, g.timeout) // --timeout bounds it all
	r, err := b.Verify(cmd.Context(), conn, t)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if f.asJSON {
		err = printReportJSON(out, r)
	} else {
		err = printReport(out, r, b.Delay(), what, apply, f.verbose)
	}
	if err != nil {
		return err
	}
	if !r.OK() {
		msg := fmt.Sprintf("%s: %d missing, %d with other arguments", what, len(r.Missing), len(r.Differs))
		if len(r.Unresolved) > 0 {
			msg += fmt.Sprintf(", %s to names declared nowhere", plural(len(r.Unresolved), "binding"))
		}
		if r.DeadLettering != "" {
			msg += ", dead-lettering does not work"
		}
		return errors.New(msg)
	}
	return nil
}

// reportJSON is a topology.Report in JSON.
type reportJSON struct {
	OK      bool          `json:"ok"`
	Missing []string      `json:"missing"`
	Differs []differsJSON `json:"differs"`
	// Unchecked are the bindings: AMQP 0-9-1 cannot tell whether a binding exists.
	Unchecked []string `json:"unchecked"`
	// Unresolved are the bindings to names that neither the topology nor the broker has.
	Unresolved []string `json:"unresolved"`
	// DeadLettering is what is wrong with the broker's dead-lettering, "" when it works.
	DeadLettering string `json:"dead_lettering,omitempty"`
}

// differsJSON is an exchange or queue that exists with other arguments.
type differsJSON struct {
	What     string `json:"what"`
	Name     string `json:"name"`
	Argument string `json:"argument"` // "" when the broker did not say which
	Existing string `json:"existing_type,omitempty"`
	Hint     string `json:"hint"`
	Error    string `json:"error"`
}

// fewMissing is how many missing exchanges and queues verify lists one by one without -v.
const fewMissing = 10

// printReport writes r as text: what is missing (one per line when verbose or few, else how
// many, of the delay levels d and of what, with apply, the command that declares them), what
// differs, the unresolved bindings (Report.String), and how many bindings were not checked.
func printReport(out io.Writer, r topology.Report, d topology.Delay, what, apply string, verbose bool) error {
	if verbose || len(r.Missing) <= fewMissing {
		for _, m := range r.Missing {
			fmt.Fprintf(out, "missing: %s\n", m)
		}
	} else {
		for _, line := range summariseMissing(r.Missing, d, what, apply) {
			fmt.Fprintf(out, "missing: %s\n", line)
		}
	}
	rest := r
	rest.Missing = nil
	text := rest.String()
	if !r.OK() {
		text = strings.TrimSuffix(text, "ok\n") // only Missing made r fail
	}
	_, err := fmt.Fprintf(out, "%s(%s not checked: AMQP 0-9-1 cannot tell whether a binding exists; apply declares them)\n",
		text, plural(len(r.Unchecked), "binding"))
	return err
}

// summariseMissing counts the missing exchanges and queues (as Report.Missing describes
// them) of the delay levels d and the others, of what, and says what to run.
func summariseMissing(missing []string, d topology.Delay, what, apply string) []string {
	levels := map[string]string{} // Report.Missing's description of each of d's: "queue" or "exchange"
	queues, exchanges := d.Names()
	if d.Disabled {
		queues, exchanges = nil, nil
	}
	for _, q := range queues {
		levels[fmt.Sprintf("queue %q", q)] = "queue"
	}
	for _, x := range exchanges {
		levels[fmt.Sprintf("exchange %q", x)] = "exchange"
	}
	var lq, lx, oq, ox int
	for _, m := range missing {
		switch {
		case levels[m] == "queue":
			lq++
		case levels[m] == "exchange":
			lx++
		case strings.HasPrefix(m, "queue "):
			oq++
		default:
			ox++
		}
	}
	counts := func(q, x int) string {
		switch {
		case q == 0:
			return plural(x, "exchange")
		case x == 0:
			return plural(q, "queue")
		}
		return plural(q, "queue") + " and " + plural(x, "exchange")
	}
	var lines []string
	if lq+lx > 0 {
		of := fmt.Sprintf("of %d", len(queues)+len(exchanges))
		if lq+lx == len(queues)+len(exchanges) {
			of = "none declared"
		}
		lines = append(lines, fmt.Sprintf("%s of delay levels %s (%s): run %s", counts(lq, lx), d.Name(), of, apply))
	}
	if oq+ox > 0 {
		lines = append(lines, fmt.Sprintf("%s of %s: run %s", counts(oq, ox), what, apply))
	}
	lines[len(lines)-1] += " (-v lists each)"
	return lines
}

// printReportJSON writes r as JSON.
func printReportJSON(out io.Writer, r topology.Report) error {
	j := reportJSON{OK: r.OK(), Missing: nonNil(r.Missing), Differs: []differsJSON{}, Unchecked: nonNil(r.Unchecked),
		Unresolved: nonNil(r.Unresolved), DeadLettering: r.DeadLettering}
	for _, d := range r.Differs {
		j.Differs = append(j.Differs, differsJSON{
			What: d.What, Name: d.Name, Argument: strings.TrimPrefix(strings.TrimPrefix(d.Argument, "argument"), " "),
			Existing: string(d.Existing), Hint: d.Hint, Error: d.Err.Error(),
		})
	}
	return printJSON(out, j)
}
