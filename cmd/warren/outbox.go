package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/outbox"
)

// newOutbox is `warren outbox`: the outbox on PostgreSQL (package outbox).
func newOutbox(g *globals) *cobra.Command {
	var url, schema string
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "Create, inspect and replay the outbox on PostgreSQL",
		Long: "Create, inspect and replay the outbox of package outbox: the messages that committed\n" +
			"transactions published, until a relay has them confirmed by the broker.\n\n" +
			"--postgres (or $WARREN_POSTGRES_URL) names the database, e.g.\n" +
			"postgres://app:secret@db:5432/app; --schema the outbox's schema (default " + outbox.DefaultSchema + ").",
	}
	cmd.PersistentFlags().StringVar(&url, "postgres", "", "PostgreSQL URL (default $WARREN_POSTGRES_URL)")
	cmd.PersistentFlags().StringVar(&schema, "schema", outbox.DefaultSchema, "the outbox's schema")

	// withDB runs fn on a connection to the database, within --timeout.
	withDB := func(cmd *cobra.Command, fn func(ctx context.Context, conn *pgx.Conn) error) error {
		u := url
		if u == "" {
			u = os.Getenv("WARREN_POSTGRES_URL")
		}
		if u == "" {
			return fmt.Errorf("name the database: --postgres URL or $WARREN_POSTGRES_URL")
		}
		if g.timeout <= 0 {
			return fmt.Errorf("--timeout %s is not positive", human(g.timeout))
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
		defer cancel()
		cfg, err := pgx.ParseConfig(u)
		if err != nil {
			return fmt.Errorf("--postgres: %w", err) // pgx leaves the password out
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("connect to PostgreSQL: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		return fn(ctx, conn)
	}

	migrate := &cobra.Command{
		Use:   "migrate",
		Short: "Create the outbox's schema, tables and indexes if they do not exist",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDB(cmd, func(ctx context.Context, conn *pgx.Conn) error {
				if err := outbox.Migrate(ctx, conn, schema); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "outbox in schema %s: ready\n", schema)
				return nil
			})
		},
	}

	var asJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the rows waiting and the oldest one's age, the rows set aside, the relays and the inbox",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDB(cmd, func(ctx context.Context, conn *pgx.Conn) error {
				st, err := outbox.ReadStats(ctx, conn, schema)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return printJSON(out, struct {
						Schema    string `json:"schema"`
						Waiting   int64  `json:"waiting"`
						OldestMS  int64  `json:"oldest_ms"`
						SetAside  int64  `json:"set_aside"`
						Relays    int    `json:"relays"`
						Leading   bool   `json:"leading"`
						InboxKeys int64  `json:"inbox_keys_estimate"`
					}{st.Schema, st.Waiting, st.Oldest.Milliseconds(), st.SetAside, st.Relays, st.Leading, st.InboxKeys})
				}
				fmt.Fprintf(out, "outbox %s: %s waiting", st.Schema, plural(int(st.Waiting), "row"))
				if st.Waiting > 0 {
					fmt.Fprintf(out, ", the oldest written %s ago", human(st.Oldest.Round(time.Millisecond)))
				}
				fmt.Fprintf(out, "; %s set aside", plural(int(st.SetAside), "row"))
				if st.SetAside > 0 {
					fmt.Fprint(out, " (warren outbox set-aside; warren outbox replay once mended)")
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
				return nil
			})
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var limit int
	setAside := &cobra.Command{
		Use:   "set-aside",
		Short: "List the rows the broker would not take, oldest first, with the reason",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDB(cmd, func(ctx context.Context, conn *pgx.Conn) error {
				rows, err := outbox.ListSetAside(ctx, conn, schema, limit)
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
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ROW\tTOPIC\tUUID\tSET ASIDE\tREASON")
				for _, r := range rows {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", r.ID, r.Topic, r.UUID, r.At.UTC().Format(time.RFC3339), r.Reason)
				}
				return tw.Flush()
			})
		},
	}
	setAside.Flags().IntVar(&limit, "limit", 100, "at most this many rows")
	setAside.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	replay := &cobra.Command{
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
			return withDB(cmd, func(ctx context.Context, conn *pgx.Conn) error {
				n, err := outbox.Replay(ctx, conn, schema, ids...)
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
	cmd.AddCommand(migrate, status, setAside, replay)
	return cmd
}
