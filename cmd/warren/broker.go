package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/topology"
)

// connectionWithin is the broker of g, whose ConnectTimeout is --timeout.
func (g *globals) connectionWithin() (warren.Connection, error) {
	c, err := g.connection()
	c.ConnectTimeout = g.timeout
	return c, err
}

// onBroker connects to the broker of g and runs op on the connection. A failure to connect,
// or a lost connection, is retried until --timeout (what says what was attempted); a broker
// refusal is not.
func (g *globals) onBroker(cmd *cobra.Command, what string, op func(ctx context.Context, conn *amqp.Connection) error) error {
	c, err := g.connectionWithin()
	if err != nil {
		return err
	}
	return amqpx.NewDialer(c, "warren cli", logger(cmd)).Run(cmd.Context(), g.timeout, what, op)
}

// verify prints the Report of b.Verify(t), as text or, with asJSON, as JSON, and returns an
// error naming what when it is not OK.
func (g *globals) verify(cmd *cobra.Command, b *topology.Builder, t topology.Topology, what string, asJSON bool) error {
	var r topology.Report
	err := g.onBroker(cmd, "verify "+what, func(ctx context.Context, conn *amqp.Connection) error {
		var err error
		r, err = b.Verify(ctx, conn, t)
		return err
	})
	if err != nil {
		return err
	}
	if err := printReport(cmd.OutOrStdout(), r, asJSON); err != nil {
		return err
	}
	if !r.OK() {
		return fmt.Errorf("%s: %d missing, %d with other arguments", what, len(r.Missing), len(r.Differs))
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

// printReport writes r as text (Report.String, and how many bindings were not checked) or
// as JSON.
func printReport(out io.Writer, r topology.Report, asJSON bool) error {
	if !asJSON {
		_, err := fmt.Fprintf(out, "%s(%s not checked: AMQP 0-9-1 cannot tell whether a binding exists; apply declares them)\n",
			r, plural(len(r.Unchecked), "binding"))
		return err
	}
	j := reportJSON{OK: r.OK(), Missing: r.Missing, Differs: []differsJSON{}, Unchecked: r.Unchecked}
	if j.Missing == nil {
		j.Missing = []string{}
	}
	if j.Unchecked == nil {
		j.Unchecked = []string{}
	}
	for _, d := range r.Differs {
		j.Differs = append(j.Differs, differsJSON{
			What: d.What, Name: d.Name, Argument: strings.TrimPrefix(strings.TrimPrefix(d.Argument, "argument"), " "),
			Existing: string(d.Existing), Hint: d.Hint, Error: d.Err.Error(),
		})
	}
	return printJSON(out, j)
}
