// Command metrics shows warren's metrics, served for Prometheus: a router whose handler fails
// some messages (once, or on every attempt) runs on a queue of its own with an OpenTelemetry
// SDK MeterProvider read by the Prometheus exporter, 20 messages are published, and once each
// has been processed or poisoned the program prints the counters and histogram counts of its
// own /metrics page, and exits. With -serve it keeps serving /metrics on that address until
// interrupted (Ctrl-C), for a Prometheus to scrape or a browser to look at.
//
//	go run ./examples/metrics [-serve 127.0.0.1:9464]
//
// The broker is $WARREN_AMQP_URL, by default amqp://guest:guest@127.0.0.1:5672/.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	amqp "github.com/rabbitmq/amqp091-go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

const (
	queue    = "warren.example.metrics"
	messages = 20
)

func main() {
	serve := flag.String("serve", "", "keep serving /metrics on this address (host:port) until interrupted")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/metrics [-serve host:port]\n\n"+
			"Run a router whose handler fails some messages, and print the metrics it serves for Prometheus.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if err := run(url, *serve); err != nil {
		fmt.Fprintln(os.Stderr, "metrics:", err)
		os.Exit(1)
	}
}

func run(url, serve string) error {
	// The Prometheus exporter is a reader of the SDK's MeterProvider; its registry is served
	// on /metrics. (Without the otel_scope_* labels, to keep the printed lines short.)
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry), otelprom.WithoutScopeInfo())
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	addr := serve
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	metricsURL := "http://" + ln.Addr().String() + "/metrics"

	r, err := router.New(router.Config{
		Connection:    warren.Connection{URL: url},
		MeterProvider: mp, // also the global one's job: otel.SetMeterProvider(mp)
		Retry:         middleware.BackoffConfig{Delays: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer r.Close()
	defer cleanup(url)

	// Every 4th message fails its first attempt, every 10th every attempt (3, then poison).
	var settled atomic.Int32 // processed, or failed for the last time
	err = r.AddConsumerHandler(router.HandlerConfig{Name: "charge", Queue: queue}, func(msg *message.Message) error {
		i, _ := strconv.Atoi(string(msg.Payload))
		attempt := middleware.Attempt(msg)
		switch {
		case i%10 == 9:
			if attempt == 3 {
				settled.Add(1)
			}
			return errors.New("card declined")
		case i%4 == 0 && attempt == 1:
			return errors.New("payment provider unavailable")
		}
		settled.Add(1)
		return nil
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	<-r.Running()

	for i := range messages {
		if err := r.Publisher().Publish(queue, message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))); err != nil {
			return err
		}
	}
	// Wait until every message is settled and the last poison copies are counted.
	var page string
	for deadline := time.Now().Add(time.Minute); ; {
		if settled.Load() == messages {
			if page, err = scrape(metricsURL); err != nil {
				return err
			}
			if sum(page, "warren_messages_poisoned") == messages/10 {
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d messages settled within a minute", settled.Load(), messages)
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("%d messages published to %s; from %s (counters and histogram counts):\n\n", messages, queue, metricsURL)
	for _, line := range strings.Split(page, "\n") {
		if (strings.HasPrefix(line, "messaging_") || strings.HasPrefix(line, "warren_")) && !strings.Contains(line, "_bucket") &&
			!strings.Contains(line, "_sum") {
			fmt.Println(" ", line)
		}
	}
	if serve == "" {
		return nil
	}
	fmt.Printf("\nserving %s until interrupted\n", metricsURL)
	stop, done := signal.NotifyContext(context.Background(), os.Interrupt)
	defer done()
	<-stop.Done()
	return nil
}

// scrape returns the page at url.
func scrape(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// sum adds up the values of the samples of the metric whose name starts with prefix.
func sum(page, prefix string) int {
	n := 0
	sc := bufio.NewScanner(strings.NewReader(page))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			n += int(v)
		}
	}
	return n
}

// cleanup removes the example's queue; the delay levels stay, as in production.
func cleanup(url string) {
	first, _, _ := strings.Cut(url, ",")
	conn, err := amqp.Dial(first)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	_, _ = ch.QueueDelete(queue, false, false, false)
	_, _ = ch.QueueDelete(topology.PoisonQueue(queue), false, false, false)
	_ = ch.ExchangeDelete(topology.KillExchange(queue), false, false)
}
