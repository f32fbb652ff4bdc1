package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"regexp"
	"sort"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
	"github.com/warrenmq/warren/ui"
)

var (
	uiQueues = flag.Int("ui-queues", 50, "work queues of the dashboard's overview")
	uiPoison = flag.Int("ui-poison", 100000, "messages in the poison queue of the dashboard's poison page")
)

// benchUI measures how long the dashboard takes to answer: the overview of *uiQueues work
// queues and a full set of delay levels (120 level queues with the defaults), and the first
// page of a poison queue of *uiPoison messages. Each page is loaded over HTTP from an
// httptest server, as a browser would, to its last byte.
func benchUI() {
	delay := config(topology.Delay{Prefix: name("delay")}).Delay
	levels, _ := delay.Names()
	fmt.Printf("== dashboard: overview of %d work queues and %d delay level queues; first page of a poison queue of %d messages\n",
		*uiQueues, len(levels)-1, *uiPoison)
	b, err := topology.NewBuilder(config(delay), nil)
	must(err)
	var queues, allQueues, allExchanges []string
	for i := range *uiQueues {
		q := name("ui" + strconv.Itoa(i))
		queues = append(queues, q)
		qs, xs := testenv.WorkQueueNames(q)
		allQueues, allExchanges = append(allQueues, qs...), append(allExchanges, xs...)
	}
	defer cleanupDelay(delay)
	defer cleanup(allQueues, allExchanges)
	ctx := context.Background()
	must(b.Apply(ctx, warren.Connection{URL: *url}, topology.Topology{Queues: topologyQueues(queues)}))
	fillPoison(queues[0], *uiPoison)

	o, err := ops.New(ops.Config{Connection: warren.Connection{URL: *url}, Delay: delay, Timeout: time.Minute}, nil)
	must(err)
	defer o.Close()
	h, err := ui.New(ui.Config{Ops: o, Queues: queues, SampleInterval: -1, Timeout: time.Minute}, nil)
	must(err)
	defer h.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()

	load := func(path string) float64 {
		start := time.Now()
		resp, err := http.Get(srv.URL + path)
		must(err)
		body, err := io.ReadAll(resp.Body)
		must(err)
		must(resp.Body.Close())
		if resp.StatusCode != http.StatusOK {
			must(fmt.Errorf("GET %s: %s: %s", path, resp.Status, pageError.Find(body)))
		}
		return float64(time.Since(start).Microseconds()) / 1000
	}
	report := func(what, line string, n int, path string) {
		load(path) // the connection dialled, the templates warm
		var ms []float64
		for range n {
			ms = append(ms, load(path))
		}
		sort.Float64s(ms)
		fmt.Printf("   %-40s p50 %8.1f ms   max %8.1f ms   (%d loads)\n", what, median(ms), ms[len(ms)-1], n)
		result(line, "%.1f", median(ms))
	}
	report("overview", "ui_overview_ms", 20, "/")
	report(fmt.Sprintf("poison page, %d messages", *uiPoison), "ui_poison_first_page_ms", 3, "/poison?refresh=1&queue="+neturl.QueryEscape(queues[0]))
}

// pageError finds the error a page shows.
var pageError = regexp.MustCompile(`<p class="error"[^>]*>[^<]*`)

func topologyQueues(names []string) []topology.Queue {
	qs := make([]topology.Queue, len(names))
	for i, n := range names {
		qs[i] = topology.Queue{Name: n}
	}
	return qs
}

// fillPoison publishes n poison messages of two kinds of failure into queue's poison queue,
// confirmed, 256 in flight.
func fillPoison(queue string, n int) {
	conn, ch, err := dialChannel()
	must(err)
	defer conn.Close()
	must(ch.Confirm(false))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 256))
	at := time.Now().UTC().Format(time.RFC3339Nano)
	inflight := 0
	for i := range n {
		errText := "card declined"
		if i%2 == 1 {
			errText = "order " + strconv.Itoa(i) + " not found"
		}
		must(ch.PublishWithContext(context.Background(), "", topology.PoisonQueue(queue), false, false, amqp.Publishing{
			MessageId: strconv.Itoa(i), ContentType: "application/json", DeliveryMode: amqp.Persistent,
			Body: []byte(`{"order":` + strconv.Itoa(i) + `}`),
			Headers: amqp.Table{warren.PoisonErrorKey: errText, warren.PoisonReasonKey: warren.PoisonReasonExhausted,
				warren.PoisonHandlerKey: "charge", warren.PoisonQueueKey: queue, warren.PoisonAttemptsKey: "4",
				warren.PoisonLastFailKey: at, warren.PoisonFirstFailKey: at},
		}))
		if inflight++; inflight == 256 {
			for range inflight {
				if c := <-confirms; !c.Ack {
					must(fmt.Errorf("poison message %d not confirmed", c.DeliveryTag))
				}
			}
			inflight = 0
		}
	}
	for range inflight {
		<-confirms
	}
}
