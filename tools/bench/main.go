// Command bench measures warren against raw amqp091-go and plain watermill-amqp on the same
// broker, in one process, and prints the figures side by side, then one machine-readable
// line per figure. Run it with `make bench`.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpurl"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

var (
	url        = flag.String("url", envOr("WARREN_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "broker URL, or the URLs of a cluster's nodes separated by commas (raw contenders use the first)")
	publish    = flag.Int("publish", 20000, "messages per publish run")
	rounds     = flag.Int("rounds", 5, "publish and consume runs per contender (the median is reported)")
	window     = flag.Int("window", 256, "messages in flight (raw) / publishing goroutines (warren, watermill-amqp)")
	consume    = flag.Int("consume", 20000, "messages per consume run")
	delayed    = flag.Int("delayed", 10000, "delayed messages")
	maxWait    = flag.Duration("max-delay", 60*time.Second, "longest delay (delays are spread uniformly from 10ms)")
	radix      = flag.Int("radix", 0, "radix of the delay levels (0: warren's default)")
	dpubs      = flag.Int("delay-publishers", 16, "goroutines publishing the delayed messages")
	listEvery  = flag.Duration("list-every", 100*time.Millisecond, "ledger section: how often the ledger is listed while the messages wait")
	only       = flag.String("only", "", "comma-separated sections to run: publish,consume,rpc,delay,ledger,kill,ui,outbox,ordered (default all)")
	consumers  = flag.String("consumers", "", "comma-separated contenders of the consume section: raw,warren,watermill,copystore,metrics,idem-memory,idem-redis,handlers20 (default all)")
	qtype      = flag.String("queue-type", "", "type of every queue, warren's and the others' (default warren's default, quorum)")
	dclassic   = flag.Bool("delay-classic", true, "run the delay bench once more with classic levels (delay_classic_* lines)")
	profileDir = flag.String("profile", "", "write, into this directory, a CPU profile of every contender's first round (NAME.cpu.pprof) and allocation profiles of its second, with every allocation recorded (NAME.allocs.pprof less NAME.allocs-base.pprof: go tool pprof -diff_base)")
	redisAddr  = flag.String("redis", envOr("WARREN_REDIS_ADDR", "127.0.0.1:6379"), "Redis of the warren+CopyStore and warren+idem(Redis) consume contenders")

	killProcs     = flag.Int("kill-procs", 3, "consumer processes of the kill bench (4 consumers each)")
	killRuns      = flag.Int("kill-runs", 20, "kills measured")
	killChildMode = flag.Bool("kill-child", false, "run as a consumer process of the kill bench")
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// results collects the machine-readable lines, printed last.
var results []string

func result(name string, format string, v any) {
	results = append(results, fmt.Sprintf("%s "+format, name, v))
}

func main() {
	flag.Parse()
	if *cpuChild != "" {
		runCPUChild()
		return
	}
	if *killChildMode {
		killChild()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	conn, _, err := amqpx.Dial(ctx, warren.Connection{URL: *url}, "warren bench")
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: no broker at %s (run `make broker`): %v\n", amqpurl.Redact(*url), err)
		os.Exit(1)
	}
	conn.Close()
	if *profileDir != "" {
		must(os.MkdirAll(*profileDir, 0o755))
	}

	if *cpuMode {
		benchCPU()
		printResults()
		return
	}
	run := func(section string) bool { return *only == "" || strings.Contains(","+*only+",", ","+section+",") }
	if run("publish") {
		benchPublish()
	}
	if run("consume") {
		benchConsume()
	}
	if run("rpc") {
		benchRPC()
	}
	if run("kill") {
		benchKill()
	}
	if run("delay") {
		benchDelay()
	}
	if run("ledger") {
		benchLedger()
	}
	if run("ui") {
		benchUI()
	}
	if run("outbox") {
		benchOutbox()
	}
	if run("ordered") {
		benchOrdered()
	}
	printResults()
}

// printResults prints the machine-readable lines, after a blank line.
func printResults() {
	fmt.Println()
	for _, r := range results {
		fmt.Println(r)
	}
}

// config is the topology configuration of every section: warren's defaults, the queue type
// of -queue-type and the delay levels d, with defaults applied.
func config(d topology.Delay) topology.Config {
	return topology.Config{QueueType: topology.QueueType(*qtype), Delay: d}.WithDefaults()
}

// queueType is the type of the queues of this run.
func queueType() topology.QueueType { return config(topology.Delay{}).QueueType }

// queueArgs are the arguments warren declares work queue q with: raw amqp091-go and
// watermill-amqp declare their queues with the same ones, so that every contender works on a
// queue of the same type.
func queueArgs(q string) amqp.Table {
	b, err := topology.NewBuilder(config(topology.Delay{}), nil)
	must(err)
	return b.QueueArgs(topology.Queue{Name: q})
}

// name returns a name of this run's own.
func name(what string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "warren-bench." + what + "." + hex.EncodeToString(b)
}

// dialChannel connects to the broker and opens a channel; closing conn closes both.
func dialChannel() (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.Dial(firstNode())
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

// cleanup removes queues and exchanges the bench made.
func cleanup(queues, exchanges []string) {
	if err := testenv.DeleteAt(*url, queues, exchanges); err != nil {
		fmt.Fprintln(os.Stderr, "bench: cleanup:", err)
	}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// consumeAll reads n messages from queue with a raw consumer and calls fn for each, at its
// arrival time.
func consumeAll(ctx context.Context, queue string, n int, fn func(d amqp.Delivery, at time.Time)) error {
	conn, ch, err := dialChannel()
	if err != nil {
		return err
	}
	defer conn.Close()
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("consumer of %s closed after %d of %d", queue, i, n)
			}
			fn(d, time.Now())
		case <-ctx.Done():
			return fmt.Errorf("%d of %d messages arrived in %s: %w", i, n, queue, ctx.Err())
		}
	}
	return nil
}

// firstNode is the first URL of -url: the raw and watermill-amqp contenders, which take one
// URL, use that node (warren's take the whole list).
func firstNode() string { return amqpurl.Split(*url)[0] }
