// Command dashboard mounts warren's dashboard (package ui) in a service, under /warren/,
// behind the service's own login, with actions allowed for one user. First it makes a
// backlog to look at: -backlog messages that its handler fails for good in two ways (a
// declined card, an order not found), so that they land in the poison queue, and a few
// delayed messages waiting in the delay levels.
//
//	go run ./examples/dashboard [-backlog 20000] [-listen 127.0.0.1:8080]
//
// Then open http://127.0.0.1:8080/warren/ (user admin, password printed). -hostile adds
// failures whose error, header and body hold markup and control characters (the page shows
// them as text); -once loads two pages, prints what they say and exits.
package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
	"github.com/warrenmq/warren/ui"
)

const (
	orders = "warren.example.dashboard.orders"
	emails = "warren.example.dashboard.emails"
)

func main() {
	backlog := flag.Int("backlog", 20000, "messages that fail for good and land in the poison queue")
	listen := flag.String("listen", "127.0.0.1:8080", "address to serve on")
	hostile := flag.Bool("hostile", false, "add failures with markup and control characters in their error, headers and body")
	once := flag.Bool("once", false, "load the overview and the poison page once, print what they say, and exit")
	password := flag.String("password", "", "admin's password (default: a random one, printed)")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/dashboard [-backlog 20000] [-listen 127.0.0.1:8080] [-hostile] [-once] [-password P]\n\n"+
			"Make a backlog of poison and delayed messages, then serve warren's dashboard under /warren/.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *password == "" {
		*password = randomPassword()
	}
	if err := run(ctx, url, *listen, *password, *backlog, *hostile, *once); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url, listen, password string, backlog int, hostile, once bool) error {
	conn := warren.Connection{URL: url}
	if err := makeBacklog(ctx, conn, backlog, hostile); err != nil {
		return err
	}

	// The dashboard: ops to read and operate the broker, a Killer for kill and resume.
	o, err := ops.New(ops.Config{Connection: conn}, nil)
	if err != nil {
		return err
	}
	defer o.Close()
	k, err := kill.NewKiller(kill.Config{Connection: conn, Wait: 3 * time.Second}, nil)
	if err != nil {
		return err
	}
	dash, err := ui.New(ui.Config{
		Ops: o, Killer: k, Queues: []string{orders, emails}, Prefix: "/warren",
		Topology:     &topology.File{Topology: topology.Topology{Queues: []topology.Queue{{Name: orders}, {Name: emails}}}},
		AllowActions: true,
		// Every page is behind the login below; actions are for admin alone.
		Authorize: func(r *http.Request, a ui.Action) error {
			if user, _, _ := r.BasicAuth(); a != ui.ActionView && user != "admin" {
				return fmt.Errorf("%s may only look", user)
			}
			return nil
		},
	}, watermill.NewStdLogger(false, false)) // the audit lines: who did what, how many
	if err != nil {
		return err
	}
	defer dash.Close()

	mux := http.NewServeMux()
	mux.Handle("/warren/", login("admin", password, dash))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	base := "http://" + ln.Addr().String() + "/warren/"
	fmt.Printf("dashboard on %s  (user admin, password %s)\n", base, password)
	if once {
		return look(base, password)
	}
	fmt.Println("interrupt to stop")
	<-ctx.Done()
	return nil
}

// makeBacklog declares the queues and the delay levels, fails backlog messages for good in
// orders' handler (two kinds of failure, and with hostile a third whose text holds markup
// and control characters), and leaves ten delayed messages waiting for emails.
func makeBacklog(ctx context.Context, conn warren.Connection, backlog int, hostile bool) error {
	if err := fresh(ctx, conn); err != nil {
		return err
	}
	r, err := router.New(router.Config{Connection: conn}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer r.Close()
	err = r.AddConsumerHandler(router.HandlerConfig{Name: "charge", Queue: orders}, func(msg *message.Message) error {
		switch msg.Metadata.Get("kind") {
		case "hostile":
			return warren.Permanent(errors.New(`<script>alert("x")</script>` + "\x1b[2J\x07 card declined"))
		case "missing":
			return warren.Permanent(fmt.Errorf("order %s not found", msg.Metadata.Get("order")))
		}
		return warren.Permanent(errors.New("card declined"))
	})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = r.Run(runCtx) }()
	select {
	case <-r.Running():
	case <-ctx.Done():
		return ctx.Err()
	}

	var batch []*message.Message
	for i := range backlog {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":`+strconv.Itoa(i)+`,"amount":"12.50"}`))
		msg.Metadata.Set("order", strconv.Itoa(i))
		if i%3 == 0 {
			msg.Metadata.Set("kind", "missing")
		}
		if hostile && i < 5 {
			msg = message.NewMessage(watermill.NewUUID(), []byte("\xff\xfe<img src=x onerror=alert(1)>"))
			msg.Metadata.Set("kind", "hostile")
			msg.Metadata.Set("note", "<b>bold</b> \x1b]0;title\x07")
		}
		if batch = append(batch, msg); len(batch) == 256 || i == backlog-1 {
			if err := r.Publisher().Publish(orders, batch...); err != nil {
				return err
			}
			batch = nil
		}
	}
	pub, err := dlx.NewPublisher(dlx.Config{Connection: conn, Declare: topology.Topology{Queues: []topology.Queue{{Name: emails}}}}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer pub.Close()
	for i := range 10 {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"reminder":`+strconv.Itoa(i)+`}`))
		warren.Delay(msg, time.Duration(i+1)*time.Hour)
		if err := pub.Publish(emails, msg); err != nil {
			return err
		}
	}
	// Wait until the handler has failed every message of the backlog.
	o, err := ops.New(ops.Config{Connection: conn}, nil)
	if err != nil {
		return err
	}
	defer o.Close()
	for start := time.Now(); time.Since(start) < 5*time.Minute; time.Sleep(200 * time.Millisecond) {
		st, err := o.Status(ctx, orders)
		if err != nil {
			return err
		}
		if q := st.Queues[0]; q.Ready == 0 && q.Poison >= backlog {
			fmt.Printf("backlog: %d messages in the poison queue of %s, %d waiting in the delay levels\n", q.Poison, orders, st.Delay.Waiting)
			return nil
		}
	}
	return errors.New("the backlog did not reach the poison queue within 5 minutes")
}

// fresh deletes the orders queue and its poison queue, and empties the emails queue, so that
// each run starts from its own backlog. The delayed messages of earlier runs reach emails
// when they are due.
func fresh(ctx context.Context, conn warren.Connection) error {
	c, err := amqp.Dial(strings.Split(conn.URL, ",")[0])
	if err != nil {
		return err
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return err
	}
	for _, q := range []string{orders, topology.PoisonQueue(orders)} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return err
		}
	}
	_, _ = ch.QueuePurge(emails, false) // a missing queue closes the channel: it is declared later
	return ctx.Err()
}

// login is the service's own authentication: HTTP basic, one user.
func login(user, password string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="warren"`)
			http.Error(w, "log in", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func randomPassword() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var (
	title    = regexp.MustCompile(`<title>([^<]*)</title>`)
	meta     = regexp.MustCompile(`<p class="meta">([^<]*)`)
	problems = regexp.MustCompile(`(?s)<p id="problems"[^>]*>(.*?)</p>`)
	tag      = regexp.MustCompile(`<[^>]*>`)
	space    = regexp.MustCompile(`\s+`)
)

// look loads the overview and the poison page of orders, as admin, and prints their title
// and first line, and the overview's line of what is wrong.
func look(base, password string) error {
	for _, path := range []string{"", "poison?queue=" + orders} {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		if err != nil {
			return err
		}
		req.SetBasicAuth("admin", password)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", base+path, resp.Status)
		}
		t, m := title.FindSubmatch(body), meta.FindSubmatch(body)
		if t == nil || m == nil {
			return fmt.Errorf("GET %s: not a dashboard page", base+path)
		}
		fmt.Printf("%s: %s\n", t[1], m[1])
		if p := problems.FindSubmatch(body); p != nil {
			fmt.Println(html.UnescapeString(strings.TrimSpace(space.ReplaceAllString(tag.ReplaceAllString(string(p[1]), ""), " "))))
		}
	}
	return nil
}
