package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware/redisstore"
	"github.com/warrenmq/warren/topology"
)

var (
	cpuMode   = flag.Bool("cpu", false, "count instructions per message with valgrind's callgrind instead of timing (make bench-cpu)")
	cpuN      = flag.Int("cpu-n", 6000, "cpu: messages of the shorter run; the longer has twice as many, and a path costs (count at 2N - count at N) / N")
	cpuOnly   = flag.String("cpu-only", "", "cpu: comma-separated paths to count (default all; see cpuPaths)")
	cpuKeep   = flag.String("cpu-out", "", "cpu: keep callgrind's output files in this directory (callgrind_annotate reads them)")
	cpuRounds = flag.Int("cpu-rounds", 3, "cpu: runs of each size per path; the median of the rounds' figures is reported")
	cpuProcs  = flag.Int("cpu-procs", 1, "cpu: GOMAXPROCS of the counted runs")
	cpuChild  = flag.String("cpu-child", "", "run one path's run of -cpu-n messages, counted between the start and the end of its span (set by -cpu)")
)

// cpuPath is one path of the cpu section: run handles the messages (*publish, *consume or
// *rpcCalls of them, set to the run's count) on a queue of its own, between a span's start
// and stop, which switch callgrind's counting on and off.
type cpuPath struct {
	name string
	what string
	run  func(q string, delay topology.Delay) error
}

// cpuPaths are the paths counted: raw amqp091-go, warren and watermill-amqp on the same
// broker, confirmed persistent 256-byte messages (64-byte rpc requests) on a queue of
// warren's type.
var cpuPaths = []cpuPath{
	{"publish-raw", "raw amqp091-go, one goroutine, a window of 256 confirmations", func(q string, _ topology.Delay) error {
		_, err := publishRaw(q, make([]byte, 256))
		return err
	}},
	{"publish-raw-goroutines", "raw amqp091-go, 256 goroutines, each waiting for its confirmation", func(q string, _ topology.Delay) error {
		_, err := publishRawGoroutines(q, make([]byte, 256))
		return err
	}},
	{"publish-warren", "warren dlx.Publisher, 256 goroutines, one message per Publish", func(q string, d topology.Delay) error {
		_, err := publishWarren(q, *publish, make([]byte, 256), d)
		return err
	}},
	{"publish-batch", "warren dlx.Publisher, one goroutine, 256 messages per Publish", func(q string, d topology.Delay) error {
		_, err := publishWarrenBatches(q, make([]byte, 256), d)
		return err
	}},
	{"publish-delayed", "warren dlx.Publisher, 256 goroutines, each message delayed by 200 ms (two levels)", func(q string, d topology.Delay) error {
		_, err := publishWarrenDelayed(q, make([]byte, 256), d, 200*time.Millisecond)
		return err
	}},
	{"publish-watermill", "watermill-amqp v3 publisher, 256 goroutines, confirms on", func(q string, _ topology.Delay) error {
		_, err := publishWatermill(q, make([]byte, 256))
		return err
	}},
	{"consume-raw", "raw amqp091-go, prefetch 256, acked one by one", func(q string, _ topology.Delay) error {
		_, err := consumeRaw(q)
		return err
	}},
	{"consume-warren", "warren router, default chain and concurrency, no tracer installed", func(q string, d topology.Delay) error {
		_, err := consumeWarren(q, d, warrenOptions{noTracer: true})
		return err
	}},
	{"consume-sdk", "warren router with an OTel SDK tracer provider (as make bench)", func(q string, d topology.Delay) error {
		_, err := consumeWarren(q, d, warrenOptions{})
		return err
	}},
	{"consume-copystore", "warren router, no tracer, router.Config.CopyStore on Redis", consumeCopyStore},
	{"consume-watermill", "watermill-amqp v3 subscriber and router, defaults", func(q string, _ topology.Delay) error {
		_, err := consumeWatermill(q)
		return err
	}},
	{"rpc-raw", "raw amqp091-go client and server, direct reply-to, requests and replies confirmed", func(q string, _ topology.Delay) error {
		_, err := rpcRaw(q, true)
		return err
	}},
	{"floor-loop", "no broker: messages made beforehand, taken in a loop and acknowledged", func(string, topology.Delay) error {
		return floorLoop(*consume)
	}},
	{"floor-router", "no broker: the same messages through a Watermill router, no middleware", func(string, topology.Delay) error {
		return floorRouter(*consume)
	}},
	{"floor-message", "no broker: a Watermill message made from a delivery's id, body and 3 headers", func(string, topology.Delay) error {
		return floorMessage(*consume)
	}},
	{"floor-span", "no broker: one OTel SDK consumer span started and ended", func(string, topology.Delay) error {
		return floorSpan(*consume)
	}},
	{"rpc-warren", "warren rpc.Client and a router handler with Reply, direct reply-to", func(q string, d topology.Delay) error {
		_, err := rpcWarren(q, d, "")
		return err
	}},
}

// cpuCount is what one path cost a message: instructions, allocations and bytes allocated,
// and the extra figures its run reported (see cpuExtra).
type cpuCount struct {
	instr, allocs, bytes float64
	extra                map[string]float64
}

// benchCPU counts, for every path, the instructions of a run of N messages and of one of 2N
// under callgrind, each in a child process of its own, and prints what a message costs: the
// difference over N, so that what a run costs once (connecting, declaring, starting
// goroutines) drops out. Allocations are counted the same way, by the runtime. The broker's
// work is not counted: it is another process.
func benchCPU() {
	if !canCount {
		must(fmt.Errorf("-cpu: valgrind client requests are built for amd64 only"))
	}
	if _, err := exec.LookPath("valgrind"); err != nil {
		must(fmt.Errorf("-cpu needs valgrind (apt-get install valgrind): %w", err))
	}
	out := *cpuKeep
	if out == "" {
		dir, err := os.MkdirTemp("", "warren-bench-cpu")
		must(err)
		defer os.RemoveAll(dir)
		out = dir
	} else {
		must(os.MkdirAll(out, 0o755))
	}
	fmt.Printf("== cpu: instructions per message counted by callgrind, (count at %d - count at %d) / %d, in the client process only; %s queues, confirmed persistent messages\n",
		2**cpuN, *cpuN, *cpuN, queueType())
	counts := map[string]cpuCount{}
	for _, p := range cpuPaths {
		if *cpuOnly != "" && !strings.Contains(","+*cpuOnly+",", ","+p.name+",") {
			continue
		}
		c := cpuMedian(p.name, out)
		counts[p.name] = c
		fmt.Printf("   %-18s %8.0f instr/msg %6.1f allocs/msg %7.0f B/msg   (%s)\n", p.name, c.instr, c.allocs, c.bytes, p.what)
	}
	ratio := func(name, a, b string, of func(cpuCount) float64) {
		x, okA := counts[a]
		y, okB := counts[b]
		if okA && okB {
			result("ratio "+name, "%.2f", of(x)/of(y))
		}
	}
	instr := func(c cpuCount) float64 { return c.instr }
	allocs := func(c cpuCount) float64 { return c.allocs }
	ratio("publish_instr_vs_raw", "publish-warren", "publish-raw", instr)
	ratio("publish_batch_instr_vs_raw", "publish-batch", "publish-raw", instr)
	ratio("publish_delayed_instr_vs_publish", "publish-delayed", "publish-warren", instr)
	ratio("consume_instr_vs_raw", "consume-warren", "consume-raw", instr)
	ratio("consume_sdk_instr_vs_raw", "consume-sdk", "consume-raw", instr)
	ratio("rpc_instr_vs_raw_confirmed", "rpc-warren", "rpc-raw", instr)
	ratio("publish_instr_vs_watermill", "publish-warren", "publish-watermill", instr)
	ratio("consume_instr_vs_watermill", "consume-warren", "consume-watermill", instr)
	ratio("publish_allocs_vs_raw", "publish-warren", "publish-raw", allocs)
	ratio("consume_allocs_vs_raw", "consume-warren", "consume-raw", allocs)
	if c, ok := counts["consume-copystore"]; ok {
		if w, ok := counts["consume-warren"]; ok {
			result("copystore_instr_added", "%.0f", c.instr-w.instr)
		}
		result("copystore_redis_roundtrips_per_msg", "%.4f", c.extra["redis_roundtrips"])
		result("copystore_redis_cpu_us_per_msg", "%.2f", c.extra["redis_cpu_us"])
	}
	ratio("publish_raw_goroutines_vs_raw", "publish-raw-goroutines", "publish-raw", instr)
	if r, ok := counts["floor-router"]; ok {
		if l, ok := counts["floor-loop"]; ok {
			result("router_floor_instr", "%.0f", r.instr-l.instr) // what Watermill's router adds to a loop
		}
	}
	for _, name := range []string{"publish-raw", "publish-warren", "consume-raw", "consume-warren"} {
		if c, ok := counts[name]; ok {
			result("instr_per_msg_"+strings.ReplaceAll(name, "-", "_"), "%.0f", c.instr)
		}
	}
}

// cpuMedian runs path name *cpuRounds times with N and 2N messages and returns the median of
// each figure over the rounds, a figure of a round being (count at 2N - count at N) / N.
func cpuMedian(name, out string) cpuCount {
	var instr, allocs, bytes []float64
	extra := map[string][]float64{}
	n := float64(*cpuN)
	for range *cpuRounds {
		var one, two cpuCount
		var wg sync.WaitGroup // two processes at once: counts do not depend on the machine's load
		wg.Go(func() { one = cpuRun(name, *cpuN, out) })
		wg.Go(func() { two = cpuRun(name, 2**cpuN, out) })
		wg.Wait()
		instr = append(instr, (two.instr-one.instr)/n)
		allocs = append(allocs, (two.allocs-one.allocs)/n)
		bytes = append(bytes, (two.bytes-one.bytes)/n)
		for k, v := range two.extra {
			extra[k] = append(extra[k], (v-one.extra[k])/n)
		}
	}
	c := cpuCount{instr: median(instr), allocs: median(allocs), bytes: median(bytes), extra: map[string]float64{}}
	for k, vs := range extra {
		c.extra[k] = median(vs)
	}
	if len(instr) > 1 {
		fmt.Printf("   %-18s rounds: %s instr/msg\n", name, fmtRates(instr))
	}
	return c
}

// cpuRun runs path name with n messages in a child process under callgrind and returns what
// the run counted.
func cpuRun(name string, n int, out string) cpuCount {
	exe, err := os.Executable()
	must(err)
	file := filepath.Join(out, fmt.Sprintf("%s.%d.callgrind", name, n))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	args := []string{"--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=" + file, exe,
		"-cpu-child", name, "-cpu-n", strconv.Itoa(n), "-url", *url, "-redis", *redisAddr, "-queue-type", *qtype}
	cmd := exec.CommandContext(ctx, "valgrind", args...)
	// Asynchronous preemption signals each goroutine that runs long; under valgrind a signal
	// lands at a point that depends on timing, and the counts would with it. Valgrind runs
	// one thread at a time: with more than one P, the idle ones spin looking for work for as
	// long as the others run, a count that follows the timing too (docs/decisions.md).
	// Valgrind (3.19) cannot run RDTSCP, which the runtime reads the clock with where the CPU
	// has it: cpu.rdtscp=off makes it use RDTSC.
	cmd.Env = append(os.Environ(), "GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off", fmt.Sprintf("GOMAXPROCS=%d", *cpuProcs))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		must(fmt.Errorf("cpu: %s with %d messages: %w\n%s%s", name, n, err, stdout.String(), stderr.String()))
	}
	c := cpuCount{extra: map[string]float64{}}
	c.instr = callgrindTotal(file)
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || f[0] != "cpu-child" {
			continue
		}
		v, err := strconv.ParseFloat(f[2], 64)
		must(err)
		switch f[1] {
		case "mallocs":
			c.allocs = v
		case "bytes":
			c.bytes = v
		default:
			c.extra[f[1]] = v
		}
	}
	return c
}

// callgrindTotal reads the instructions counted from callgrind's output file.
func callgrindTotal(file string) float64 {
	b, err := os.ReadFile(file)
	must(err)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "totals: "); ok {
			v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
			must(err)
			return v
		}
	}
	must(fmt.Errorf("cpu: no totals in %s", file))
	return 0
}

// cpuExtra is an extra figure of a child's run, printed for its parent.
func cpuExtra(name string, v float64) { fmt.Printf("cpu-child %s %g\n", name, v) }

// runCPUChild runs path *cpuChild once with *cpuN messages, on a queue and delay levels of
// its own that it deletes afterwards, and prints the allocations its span measured.
func runCPUChild() {
	*publish, *consume, *rpcCalls = *cpuN, *cpuN, *cpuN
	for _, p := range cpuPaths {
		if p.name != *cpuChild {
			continue
		}
		q := name("cpu")
		levels := 1 // delays up to 15 ms: the paths publish none but publish-delayed
		if p.name == "publish-delayed" {
			levels = 2
		}
		delay := config(topology.Delay{Prefix: name("delay"), Levels: levels}).Delay
		err := p.run(q, delay)
		cleanupDelay(delay)
		cleanup(testenv.WorkQueueNames(q))
		must(err)
		cpuExtra("mallocs", float64(measured.mallocs))
		cpuExtra("bytes", float64(measured.bytes))
		return
	}
	must(fmt.Errorf("-cpu-child: no path %q", *cpuChild))
}

// publishWarrenDelayed is publishWarren with every message delayed by d.
func publishWarrenDelayed(q string, body []byte, delay topology.Delay, d time.Duration) (time.Duration, error) {
	p, err := warrenPublisher(q, delay)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	return parallel(*window, *publish, func() error {
		msg := message.NewMessage(watermill.NewUUID(), body)
		warren.Delay(msg, d)
		return p.Publish(q, msg)
	})
}

// consumeCopyStore is consumeWarren without a tracer and with router.Config.CopyStore in
// Redis, whose round trips (a pipeline is one) and CPU time it reports per run.
func consumeCopyStore(q string, delay topology.Delay) error {
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr})
	defer rdb.Close()
	trips := &roundTrips{}
	rdb.AddHook(trips)
	prefix := "warren:bench:" + name("copies") + ":"
	defer deleteKeys(rdb, prefix)
	store, err := redisstore.New(redisstore.Config{Client: rdb, Prefix: prefix}, nil)
	if err != nil {
		return err
	}
	defer store.Close()
	before, err := redisCPU(rdb)
	if err != nil {
		return err
	}
	trips.n.Store(0)
	if _, err := consumeWarren(q, delay, warrenOptions{noTracer: true, copies: store}); err != nil {
		return err
	}
	n := trips.n.Load()
	after, err := redisCPU(rdb)
	if err != nil {
		return err
	}
	cpuExtra("redis_roundtrips", float64(n))
	cpuExtra("redis_cpu_us", float64((after - before).Microseconds()))
	return nil
}

// redisCPU returns the CPU time Redis has used, user and system (INFO cpu).
func redisCPU(rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			s, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("redis INFO cpu %s: %w", k, err)
			}
			total += s
		}
	}
	return time.Duration(total * float64(time.Second)), nil
}

// roundTrips is a go-redis hook that counts round trips to Redis: a command, or a pipeline.
type roundTrips struct{ n atomic.Int64 }

func (*roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (t *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t.n.Add(1)
		return next(ctx, cmd)
	}
}

func (t *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t.n.Add(1)
		return next(ctx, cmds)
	}
}
