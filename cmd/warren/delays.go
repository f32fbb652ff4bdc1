package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/statequeue"
	"github.com/warrenmq/warren/topology"
)

// delayFlags are the flags that say which delay levels a command works on: the fields of
// topology.Delay, or the config of a topology file.
type delayFlags struct {
	d             topology.Delay
	queueType     string
	leaderLocator string
	file          string
	fs            *pflag.FlagSet
	loaded        *topology.File // the file of --config, once read
}

// addDelayFlags adds the delay level flags to fs, with the library's defaults.
func addDelayFlags(fs *pflag.FlagSet) *delayFlags {
	f := &delayFlags{fs: fs}
	fs.StringVar(&f.d.Prefix, "prefix", topology.DefaultDelayPrefix, "first part of every name of the delay levels")
	fs.DurationVar(&f.d.Unit, "unit", topology.DefaultDelayUnit, "resolution of the delays, a whole number of milliseconds")
	fs.IntVar(&f.d.Radix, "radix", topology.DefaultDelayRadix, "base of a delay's digits: (radix-1)·levels queues")
	fs.IntVar(&f.d.Levels, "levels", 0, "number of digit positions (0: as many as RabbitMQ's largest TTL allows, 8 with radix 16 and unit 1ms)")
	fs.DurationVar(&f.d.Reach, "reach", 0, "longest delay: a chain of queues makes up what the levels do not reach (0: 10 years (87660h) when --levels is 0, else the levels' maximum)")
	fs.StringVar(&f.queueType, "queue-type", string(topology.Quorum), "type of the level and parking queues: quorum or classic")
	fs.StringVar(&f.leaderLocator, "leader-locator", "", `x-queue-leader-locator of quorum levels: client-local, balanced, or "" (the broker's default)`)
	fs.StringVar(&f.file, "config", "", "take the delay levels from the config of this topology file instead of the flags above")
	return f
}

// config is the topology.Config of the delay levels the flags name, each broker call
// bounded by timeout.
func (f *delayFlags) config(timeout time.Duration) (topology.Config, error) {
	var cfg topology.Config
	if f.file != "" {
		for _, name := range []string{"prefix", "unit", "radix", "levels", "reach", "queue-type", "leader-locator"} {
			if f.fs.Changed(name) {
				return cfg, fmt.Errorf("--%s and --config: give one (the file's config says which delay levels)", name)
			}
		}
		file, err := f.load()
		if err != nil {
			return cfg, err
		}
		cfg = file.Config
	} else {
		cfg.Delay = f.d
		cfg.Delay.QueueType = topology.QueueType(f.queueType)
		cfg.Delay.LeaderLocator = topology.LeaderLocator(f.leaderLocator)
	}
	cfg.Timeout = timeout
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	if cfg.Delay.Disabled {
		return cfg, errors.New("--config: the file's delay levels are disabled")
	}
	return cfg.WithDefaults(), nil
}

// load reads the topology file of --config, once.
func (f *delayFlags) load() (*topology.File, error) {
	if f.loaded == nil {
		file, err := topology.Load(f.file)
		if err != nil {
			return nil, fmt.Errorf("--config: %w", err)
		}
		f.loaded = &file
	}
	return f.loaded, nil
}

// workQueues returns queues and, with --config, the work queues of its file that are not
// among them.
func (f *delayFlags) workQueues(queues []string) ([]string, error) {
	if f.file == "" {
		return queues, nil
	}
	file, err := f.load()
	if err != nil {
		return nil, err
	}
	for _, q := range file.Queues {
		if !slices.Contains(queues, q.Name) {
			queues = append(queues, q.Name)
		}
	}
	return queues, nil
}

// builder is a topology.Builder of the delay levels the flags name.
func (f *delayFlags) builder(cmd *cobra.Command, timeout time.Duration) (*topology.Builder, error) {
	cfg, err := f.config(timeout)
	if err != nil {
		return nil, err
	}
	return topology.NewBuilder(cfg, logger(cmd))
}

func newDelays(g *globals) *cobra.Command {
	delays := &cobra.Command{
		Use:   "delays",
		Short: "Declare, verify or remove the delay levels",
		Long: "The delay levels are the fixed-TTL queues that delayed messages wait in (see topology.Delay). The\n" +
			"flags say which: the same values as the services' topology.Config.Delay, or --config FILE.",
	}
	delays.AddCommand(newDelaysApply(g), newDelaysVerify(g), newDelaysRemove(g))
	return delays
}

func newDelaysApply(g *globals) *cobra.Command {
	var (
		df     *delayFlags
		ledger bool
		force  bool
	)
	apply := &cobra.Command{
		Use:   "apply",
		Short: "Declare the delay levels (idempotent)",
		Long: "Declare the delay levels (idempotent). On RabbitMQ 3.x, each quorum queue holds 3 of the node's file\n" +
			"handles, and a node out of them stops answering connections: with --management URL (or\n" +
			"$WARREN_MANAGEMENT_URL), apply first estimates what the new queues take, warns at 80% of a node's\n" +
			"limit, and refuses past it, unless --force.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := df.builder(cmd, g.timeout)
			if err != nil {
				return err
			}
			conn, err := g.connection()
			if err != nil {
				return err
			}
			if err := g.checkFileHandles(cmd, b.Delay(), quorumQueues(b, topology.Topology{}), force); err != nil {
				return err
			}
			if err := b.Apply(cmd.Context(), conn, topology.Topology{}); err != nil {
				return err
			}
			if ledger {
				err := g.onBroker(cmd, "declare the ledger", func(ctx context.Context, conn *amqp.Connection) error {
					return statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
						return amqpx.Do(ctx, ch, func() error { return topology.DeclareLedger(ch, b.Delay()) })
					})
				})
				if err != nil {
					return err
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "declared %s\n", describeDelay(b.Delay()))
			if ledger {
				fmt.Fprintf(cmd.OutOrStdout(), "declared the ledger %s\n", b.Delay().LedgerQueue())
			}
			return nil
		},
	}
	df = addDelayFlags(apply.Flags())
	apply.Flags().BoolVar(&ledger, "ledger", false, "declare the ledger of scheduled messages too (a stream; declared on first use otherwise)")
	apply.Flags().BoolVar(&force, "force", false, "declare even though the new quorum queues would exhaust a RabbitMQ 3.x node's file handles")
	return apply
}

func newDelaysVerify(g *globals) *cobra.Command {
	var (
		df *delayFlags
		f  verifyFlags
	)
	verify := &cobra.Command{
		Use:   "verify",
		Short: "Check that the delay levels exist with the arguments the flags give them; exit 1 if not",
		Long: "Check that the delay levels exist with the arguments the flags give them; exit 1 if not. With\n" +
			"--management URL (or $WARREN_MANAGEMENT_URL), also that each of their queues runs: a level queue\n" +
			"that is down holds its messages, and AMQP alone cannot tell; and it warns (exit status unchanged)\n" +
			"of the nodes' alarms, of a file handle, memory or disk limit at 80%, and of a policy that changes\n" +
			"the levels' dead-lettering, TTLs, limits or delayed retry.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := df.builder(cmd, g.timeout)
			if err != nil {
				return err
			}
			err = g.verify(cmd, b, topology.Topology{}, "delay levels "+b.Delay().Name(),
				"`warren delays apply` with the same delay level flags", f)
			if g.managementURL() == "" {
				return err
			}
			return errors.Join(err, g.verifyRunning(cmd, b.Delay(), f.asJSON))
		},
	}
	df = addDelayFlags(verify.Flags())
	f.register(verify)
	return verify
}

func newDelaysRemove(g *globals) *cobra.Command {
	var (
		df    *delayFlags
		force bool
	)
	remove := &cobra.Command{
		Use:   "remove",
		Short: "Delete the delay levels, unless messages wait in them",
		Long: "Delete every queue and exchange of the delay levels. Refused while any level queue or the parking\n" +
			"queue holds messages (it says how many, and where), unless --force, which deletes them. Work queues\n" +
			"and exchanges lose their binding from the delivery exchange with it: `warren topology apply` (or a\n" +
			"service starting) declares it again.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := df.config(g.timeout)
			if err != nil {
				return err
			}
			d := cfg.Delay
			var r removal
			err = g.onBroker(cmd, "remove delay levels "+d.Name(), func(ctx context.Context, conn *amqp.Connection) error {
				var err error
				r, err = removeDelays(ctx, conn, d, force)
				return err
			})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			_, exchanges := d.Names()
			if r.removed == 0 {
				fmt.Fprintf(out, "no queue of delay levels %s exists; deleted their %s, if any\n", d.Name(), plural(len(exchanges), "exchange"))
			} else {
				fmt.Fprintf(out, "removed delay levels %s: %s (%d did not exist) and their %s\n",
					d.Name(), plural(r.removed, "queue"), r.absent, plural(len(exchanges), "exchange"))
			}
			if r.lost > 0 {
				fmt.Fprintf(out, "deleted %s with them\n", plural(r.lost, "message"))
			}
			return nil
		},
	}
	df = addDelayFlags(remove.Flags())
	remove.Flags().BoolVar(&force, "force", false, "delete the levels even though messages wait in them (they are lost)")
	return remove
}

// removal is what removeDelays did.
type removal struct {
	removed, absent int // queues deleted, and queues that did not exist
	lost            int // messages deleted with the queues
}

// removeDelays deletes the exchanges of d, then its queues. Unless force, it first counts
// the messages in the queues and refuses if there are any. Deleting the exchanges first
// closes the window in which a message can still arrive to the moment between the count
// and their deletion; quorum queues cannot be deleted "if empty" (NOT_IMPLEMENTED), so such
// a message is deleted with its queue, and counted in lost.
func removeDelays(ctx context.Context, conn *amqp.Connection, d topology.Delay, force bool) (removal, error) {
	var r removal
	queues, exchanges := d.Names()
	ch, err := conn.Channel()
	if err != nil {
		return r, err
	}
	defer func() { _ = ch.Close() }()
	var (
		existing []string
		waiting  []string
		total    int
	)
	for _, q := range queues {
		var info amqp.Queue
		if ch.IsClosed() { // a passive declare of a missing queue closes the channel
			if ch, err = conn.Channel(); err != nil {
				return r, err
			}
		}
		err := amqpx.Do(ctx, ch, func() (err error) {
			info, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
			return err
		})
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			r.absent++
			continue
		case err != nil:
			return r, fmt.Errorf("inspect queue %q: %w", q, err)
		}
		existing = append(existing, q)
		if info.Messages > 0 {
			total += info.Messages
			waiting = append(waiting, fmt.Sprintf("%s: %d", q, info.Messages))
		}
	}
	if total > 0 && !force {
		wait := fmt.Sprintf("%d messages wait", total)
		if total == 1 {
			wait = "1 message waits"
		}
		return r, amqpx.GiveUp(fmt.Errorf("refused: %s in delay levels %s (%s) and would be lost: let them be delivered (or move the parked ones), or --force",
			wait, d.Name(), strings.Join(waiting, ", ")))
	}
	if ch.IsClosed() {
		if ch, err = conn.Channel(); err != nil {
			return r, err
		}
	}
	// The level exchanges, the delivery exchange, the parking exchange.
	for _, x := range slices.Backward(exchanges) {
		if err := amqpx.Do(ctx, ch, func() error { return ch.ExchangeDelete(x, false, false) }); err != nil {
			return r, fmt.Errorf("delete exchange %q: %w", x, err)
		}
	}
	for _, q := range slices.Backward(existing) {
		var n int
		if err := amqpx.Do(ctx, ch, func() (err error) { n, err = ch.QueueDelete(q, false, false, false); return err }); err != nil {
			return r, fmt.Errorf("delete queue %q: %w", q, err)
		}
		r.removed++
		r.lost += n
	}
	// The ledger of scheduled messages goes with them: its records are history, not messages.
	if err := amqpx.Do(ctx, ch, func() error { _, err := ch.QueueDelete(d.LedgerQueue(), false, false, false); return err }); err != nil {
		return r, fmt.Errorf("delete the ledger %q: %w", d.LedgerQueue(), err)
	}
	return r, nil
}

// verifyRunning asks the management API (--management) whether every queue of the delay
// levels d that exists runs, prints those that do not (as text, unless asJSON), and returns
// an error naming them if any.
func (g *globals) verifyRunning(cmd *cobra.Command, d topology.Delay, asJSON bool) error {
	o, err := g.ops(cmd, d)
	if err != nil {
		return err
	}
	defer o.Close()
	s, err := o.Status(cmd.Context())
	if err != nil {
		return err
	}
	var down []string
	for _, l := range s.Delay.Levels {
		if l.Unavailable() {
			down = append(down, fmt.Sprintf("queue %q (%s)", l.Queue, l.State))
		}
	}
	if unavailable(s.Delay.ParkingState) {
		down = append(down, fmt.Sprintf("queue %q (%s)", d.ParkingQueue(), s.Delay.ParkingState))
	}
	if s.Broker != nil && !asJSON {
		for _, w := range s.Broker.Warnings() {
			fmt.Fprintf(cmd.OutOrStdout(), "warning: %s\n", w)
		}
	}
	if len(down) == 0 {
		return nil
	}
	if !asJSON {
		for _, q := range down {
			fmt.Fprintf(cmd.OutOrStdout(), "not running: %s\n", q)
		}
	}
	return fmt.Errorf("delay levels %s: not running (management API): %s", d.Name(), strings.Join(down, ", "))
}
