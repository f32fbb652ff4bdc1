package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/warrenmq/warren/outbox"
)

// postgresFlags are --postgres and --schema: the outbox's database and schema.
type postgresFlags struct{ url, schema string }

// addPostgresFlags adds --postgres, described as usage, and --schema to fs.
func addPostgresFlags(fs *pflag.FlagSet, usage string) *postgresFlags {
	f := &postgresFlags{}
	fs.StringVar(&f.url, "postgres", "", usage)
	fs.StringVar(&f.schema, "schema", outbox.DefaultSchema, "the outbox's schema")
	return f
}

// given is the database the flags and environment name: --postgres, else
// $WARREN_POSTGRES_URL; "" for none. Resolved when a command runs, as the broker URL.
func (f *postgresFlags) given() string {
	if f.url != "" {
		return f.url
	}
	return os.Getenv("WARREN_POSTGRES_URL")
}

// config parses the URL given; an error says how to name the database when none is.
func (f *postgresFlags) config() (*pgx.ConnConfig, error) {
	u := f.given()
	if u == "" {
		return nil, fmt.Errorf("name the database: --postgres URL or $WARREN_POSTGRES_URL")
	}
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("--postgres: %w", err) // pgx leaves the password out
	}
	return cfg, nil
}

// withDB runs fn on a connection to the database of f, within --timeout.
func (f *postgresFlags) withDB(cmd *cobra.Command, g *globals, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	cfg, err := f.config()
	if err != nil {
		return err
	}
	if g.timeout <= 0 {
		return fmt.Errorf("--timeout %s is not positive", human(g.timeout))
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(ctx, conn)
}

// outboxFigures are the figures of outbox.Stats as --json prints them.
type outboxFigures struct {
	Waiting   int64 `json:"waiting"`
	OldestMS  int64 `json:"oldest_ms"`
	SetAside  int64 `json:"set_aside"`
	Relays    int   `json:"relays"`
	Leading   bool  `json:"leading"`
	InboxKeys int64 `json:"inbox_keys_estimate"`
}

// outboxJSON is the outbox as --json prints it: its figures, or why they could not be read,
// and, in status, its first rows set aside.
type outboxJSON struct {
	Schema string `json:"schema"`
	*outboxFigures
	SetAsideRows []outbox.SetAsideRow `json:"set_aside_rows,omitempty"`
	Error        string               `json:"error,omitempty"`
}

// figures returns st as --json prints it.
func figures(st outbox.Stats) *outboxFigures {
	return &outboxFigures{st.Waiting, st.Oldest.Milliseconds(), st.SetAside, st.Relays, st.Leading, st.InboxKeys}
}

// printOutboxStats writes st in a few lines, as `outbox status` and `status` show it; hint
// follows the count of rows set aside when there are some.
func printOutboxStats(out io.Writer, st outbox.Stats, hint string) {
	fmt.Fprintf(out, "outbox %s: %s waiting", st.Schema, plural(int(st.Waiting), "row"))
	if st.Waiting > 0 {
		fmt.Fprintf(out, ", the oldest written %s ago", human(st.Oldest.Round(time.Millisecond)))
	}
	fmt.Fprintf(out, "; %s set aside", plural(int(st.SetAside), "row"))
	if st.SetAside > 0 {
		fmt.Fprint(out, hint)
	}
	fmt.Fprintln(out)
	switch {
	case st.Relays == 0:
		fmt.Fprintln(out, "relays: none connected: nothing is published")
	case st.Leading:
		fmt.Fprintf(out, "relays: %d connected, one publishing\n", st.Relays)
	default:
		fmt.Fprintf(out, "relays: %d connected, none holds the outbox yet\n", st.Relays)
	}
	if st.InboxKeys >= 0 {
		fmt.Fprintf(out, "inbox: about %s\n", plural(int(st.InboxKeys), "key"))
	} else {
		fmt.Fprintln(out, "inbox: not counted yet (PostgreSQL estimates it after the first ANALYZE)")
	}
}

// newOutbox is `warren outbox`: the outbox on PostgreSQL (package outbox).
func newOutbox(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "Create, inspect and replay the outbox on PostgreSQL",
		Long: "Create, inspect and replay the outbox of package outbox: the messages that committed\n" +
			"transactions published, until a relay has them confirmed by the broker.\n\n" +
			"--postgres (or $WARREN_POSTGRES_URL) names the database, e.g.\n" +
			"postgres://app:secret@db:5432/app; --schema the outbox's schema (default " + outbox.DefaultSchema + ").",
	}
	pf := addPostgresFlags(cmd.PersistentFlags(), "PostgreSQL URL (default $WARREN_POSTGRES_URL)")
	db := outboxDB{pf: pf, g: g}
	cmd.AddCommand(db.migrate(), db.status(), db.setAside(), db.replay())
	return cmd
}

// outboxDB is what the subcommands of `warren outbox` share: the flags that name the
// database, and the global ones.
type outboxDB struct {
	pf *postgresFlags
	g  *globals
}

// with runs fn on a connection to the database, within --timeout.
func (db outboxDB) with(cmd *cobra.Command, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	return db.pf.withDB(cmd, db.g, fn)
}

// migrate is `warren outbox migrate`.
func (db outboxDB) migrate() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Create the outbox's schema, tables and indexes if they do not exist",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return db.with(cmd, func(ctx context.Context, conn *pgx.Conn) error {
				if err := outbox.Migrate(ctx, conn, db.pf.schema); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "outbox in schema %s: ready\n", db.pf.schema)
				return nil
			})
		},
	}
}

// status is `warren outbox status`.
func (db outboxDB) status() *cobra.Command {
	var asJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the rows waiting and the oldest one's age, the rows set aside, the relays and the inbox",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return db.with(cmd, func(ctx context.Context, conn *pgx.Conn) error {
				st, err := outbox.ReadStats(ctx, conn, db.pf.schema)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return printJSON(out, outboxJSON{Schema: st.Schema, outboxFigures: figures(st)})
				}
				printOutboxStats(out, st, " (warren outbox set-aside; warren outbox replay once mended)")
				return nil
			})
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return status
}

// setAside is `warren outbox set-aside`.
func (db outboxDB) setAside() *cobra.Command {
	var (
		limit  int
		asJSON bool
	)
	setAside := &cobra.Command{
		Use:   "set-aside",
		Short: "List the rows the broker would not take, oldest first, with the reason",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return db.with(cmd, func(ctx context.Context, conn *pgx.Conn) error {
				rows, err := outbox.ListSetAside(ctx, conn, db.pf.schema, limit)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return printJSON(out, rows)
				}
				if len(rows) == 0 {
					fmt.Fprintln(out, "no rows set aside")
					return nil
				}
				return printSetAside(out, rows, 0)
			})
		},
	}
	setAside.Flags().IntVar(&limit, "limit", 100, "at most this many rows")
	setAside.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return setAside
}

// replay is `warren outbox replay`.
func (db outboxDB) replay() *cobra.Command {
	return &cobra.Command{
		Use:   "replay [ROW...]",
		Short: "Give rows set aside back to the relay (all of them without ROW), once what made the broker refuse them is mended",
		RunE: func(cmd *cobra.Command, args []string) error {
			ids := make([]int64, len(args))
			for i, a := range args {
				id, err := strconv.ParseInt(a, 10, 64)
				if err != nil {
					return fmt.Errorf("row %q is not a row number (warren outbox set-aside lists them)", a)
				}
				ids[i] = id
			}
			return db.with(cmd, func(ctx context.Context, conn *pgx.Conn) error {
				n, err := outbox.Replay(ctx, conn, db.pf.schema, ids...)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s given back to the relay\n", plural(int(n), "row"))
				if len(ids) > 0 && n < int64(len(ids)) {
					return &exitError{exitUnconfirmed, fmt.Sprintf("%d of the %d rows named were not set aside", int64(len(ids))-n, len(ids)), nil}
				}
				return nil
			})
		},
	}
}

// printSetAside writes rows set aside as a table, each reason cut to width characters (0:
// whole).
func printSetAside(out io.Writer, rows []outbox.SetAsideRow, width int) error {
	tw := newTable(out)
	fmt.Fprintln(tw, "ROW\tTOPIC\tUUID\tSET ASIDE\tREASON")
	for _, r := range rows {
		reason := r.Reason
		if width > 0 {
			reason = cut(reason, width)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", r.ID, r.Topic, r.UUID, r.At.UTC().Format(time.RFC3339), reason)
	}
	return tw.Flush()
}
