package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ui"
)

// uiFlags are the flags of warren ui.
type uiFlags struct {
	df      *delayFlags
	pf      *postgresFlags
	listen  string
	path    string
	queues  []string
	actions bool
	wait    time.Duration
}

func newUI(g *globals) *cobra.Command {
	var f uiFlags
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the dashboard: queues, delay levels, poison and parked messages, in a browser",
		Long: "Serve warren's dashboard (package ui) on --listen, under --path (default /warren/, where a\n" +
			"service mounts it too; / redirects there), until interrupted. It is read-only unless\n" +
			"--allow-actions: then its pages replay and delete poison messages, replay parked ones, and\n" +
			"kill and resume queues. It has no login of its own: listen on 127.0.0.1 (the default), or\n" +
			"mount package ui in a service behind its authentication. The work queues are --queue, the\n" +
			"queues of --config FILE (whose topology its topology page draws and verifies), else the ones\n" +
			"the management API lists (--management). With --postgres URL (or $WARREN_POSTGRES_URL) and\n" +
			"--schema, the overview shows the outbox too, and its page lists the rows set aside, which\n" +
			"--allow-actions lets it replay.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return g.ui(cmd, &f) },
	}
	f.df = addDelayFlags(cmd.Flags())
	f.pf = addPostgresFlags(cmd.Flags(), "PostgreSQL URL of the outbox to show (default $WARREN_POSTGRES_URL; none: no outbox)")
	cmd.Flags().StringVar(&f.listen, "listen", "127.0.0.1:8080", "address to serve on")
	cmd.Flags().StringVar(&f.path, "path", "/warren", `path prefix of every page ("" serves at /)`)
	cmd.Flags().StringArrayVar(&f.queues, "queue", nil, "a work queue to show (repeatable)")
	cmd.Flags().BoolVar(&f.actions, "allow-actions", false, "let the pages replay, delete, kill and resume (read-only without it)")
	cmd.Flags().DurationVar(&f.wait, "wait", 5*time.Second, "how long kill and resume wait for the consumers' confirmations")
	return cmd
}

// ui is warren ui: it serves the dashboard until interrupted.
func (g *globals) ui(cmd *cobra.Command, f *uiFlags) error {
	cfg, err := f.df.config(g.timeout)
	if err != nil {
		return err
	}
	queues, err := f.df.workQueues(f.queues)
	if err != nil {
		return err
	}
	drawn := f.df.loaded // with --config, the file workQueues read; else nil
	if len(queues) == 0 && g.managementURL() == "" {
		return errors.New("name the work queues (--queue, --config) or give the management API (--management)")
	}
	box, closeBox, err := f.outbox(cmd)
	if err != nil {
		return err
	}
	defer closeBox()
	o, err := g.ops(cmd, cfg.Delay)
	if err != nil {
		return err
	}
	defer o.Close()
	conn, err := g.connection()
	if err != nil {
		return err
	}
	k, err := kill.NewKiller(kill.Config{Connection: conn, Secret: []byte(os.Getenv("WARREN_KILL_SECRET")),
		PublishTimeout: g.timeout, Wait: f.wait}, logger(cmd))
	if err != nil {
		return err
	}
	h, err := ui.New(ui.Config{Ops: o, Killer: k, Queues: queues, Topology: drawn, Outbox: box, Prefix: f.path,
		AllowActions: f.actions, Timeout: g.timeout},
		watermill.NewStdLoggerWithOut(cmd.ErrOrStderr(), false, false)) // every Info line: the audit log
	if err != nil {
		return err
	}
	defer h.Close()
	return f.serve(cmd, h)
}

// outbox is the outbox the dashboard shows, nil without --postgres, and what closes its
// pool; the pool connects when a page asks.
func (f *uiFlags) outbox(cmd *cobra.Command) (*ui.Outbox, func(), error) {
	u := f.pf.given()
	if u == "" {
		return nil, func() {}, nil
	}
	pc, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, nil, fmt.Errorf("--postgres: %w", err) // pgx leaves the password out
	}
	pool, err := pgxpool.NewWithConfig(cmd.Context(), pc) // connects when a page asks
	if err != nil {
		return nil, nil, fmt.Errorf("--postgres: %w", err)
	}
	return &ui.Outbox{DB: pool, Schema: f.pf.schema}, pool.Close, nil
}

// serve serves h on --listen under --path until cmd's context ends, then shuts the server
// down, allowing 5s for the requests in flight.
func (f *uiFlags) serve(cmd *cobra.Command, h http.Handler) error {
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	srv := &http.Server{Handler: mount(f.path, h), ReadHeaderTimeout: 10 * time.Second}
	mode := "read-only"
	if f.actions {
		mode = "actions enabled"
	}
	fmt.Fprintf(cmd.OutOrStdout(), "dashboard on http://%s%s/ (%s); interrupt to stop\n", ln.Addr(), f.path, mode)
	go func() {
		<-cmd.Context().Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// mount serves h, the dashboard made with ui.Config.Prefix path, and redirects / to its
// first page.
func mount(path string, h http.Handler) http.Handler {
	if path == "" {
		return h
	}
	mux := http.NewServeMux()
	mux.Handle(path+"/", h)
	mux.Handle(path, h) // ui redirects it to path/
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, path+"/", http.StatusFound)
	})
	return mux
}
