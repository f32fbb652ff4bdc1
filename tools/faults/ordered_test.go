//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// The ordered case: a queue ordered by key (docs/ordering.md), its stream of 1,000 keys × 20
// messages published key by key in sequence, consumed by 3 processes while faults happen.
const (
	orderedKeys       = 1000
	orderedSeqs       = 20 // messages per key
	orderedLanes      = 8
	orderedProcs      = 3 // consumer processes alive at any time
	orderedPublishers = 16
	orderedRate       = 1000 // messages per second, over the publishers
	orderedKind       = "faults-ordered"
	// orderedNoCopies, set in the test's environment (the consumer processes inherit it),
	// runs the consumers without a CopyStore: every copy a fault makes is handled again.
	orderedNoCopies = "FAULTS_ORDERED_NO_COPYSTORE"
)

func init() { children[orderedKind] = orderedConsumerMain }

// orderedID is the id of message seq of key key: k0042-s07.
func orderedID(key, seq int) string { return fmt.Sprintf("k%04d-s%02d", key, seq) }

func orderedKey(key int) string { return fmt.Sprintf("k%04d", key) }

// parseOrderedID returns the key and sequence number of a message of the ordered stream.
func parseOrderedID(id string) (key string, seq int, ok bool) {
	k, s, found := strings.Cut(id, "-s")
	if !found || len(k) != 5 || k[0] != 'k' || len(s) != 2 {
		return "", 0, false
	}
	if _, err := strconv.Atoi(k[1:]); err != nil {
		return "", 0, false
	}
	seq, err := strconv.Atoi(s)
	return k, seq, err == nil
}

// orderedFate is the fate of a message of the ordered stream, from its id alone (a hash, so
// that the failures fall on any place of a key's sequence): 1% fail every attempt (poisoned,
// holding the key until the case releases it), 5% fail their first attempt (retried in place).
func orderedFate(id string) fate {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	switch n := h.Sum32() % 100; {
	case n == 0:
		return failsAlway
	case n <= 5:
		return failsOnce
	}
	return succeeds
}

func orderedTopology(queue string) topology.Topology {
	return topology.Topology{Queues: []topology.Queue{{Name: queue, Lanes: orderedLanes}}}
}

// orderedConsumerMain runs a router with one handler of $FAULTS_QUEUE ordered by key over
// orderedLanes lanes (the suite's short retry schedule, retried in place; a CopyStore in
// Redis shared by the processes, as the suite's consumer, unless $FAULTS_ORDERED_NO_COPYSTORE)
// until SIGTERM. It writes "ready"
// once running, "call <id> <attempt>" per handler call and "ok <id> <unix ns>" when a call
// succeeds, the time taken as it succeeds.
func orderedConsumerMain() int {
	line := childLine()
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	copies, closeCopies, err := childCopyStore(logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	defer closeCopies()
	queue := os.Getenv(childQueue)
	cfg := router.Config{
		Connection: warren.Connection{URL: os.Getenv(childURL)},
		Topology:   topology.Config{Delay: topology.Delay{Prefix: os.Getenv(childDelayName)}},
		Declare:    orderedTopology(queue),
		Retry:      middleware.BackoffConfig{Delays: retryDelays},
		CopyStore:  copies,
	}
	if os.Getenv(orderedNoCopies) != "" {
		cfg.CopyStore = nil
	}
	r, err := router.New(cfg, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	err = r.AddConsumerHandler(router.HandlerConfig{Queue: queue, Lanes: orderedLanes}, func(msg *message.Message) error {
		attempt := middleware.Attempt(msg)
		line("call %s %d", msg.UUID, attempt)
		time.Sleep(time.Duration(2+rand.IntN(4)) * time.Millisecond)
		_, _, ok := parseOrderedID(msg.UUID)
		switch {
		case !ok:
			return fmt.Errorf("faults: %q is not a message of the stream", msg.UUID)
		case orderedFate(msg.UUID) == failsAlway:
			return errors.New("faults: this message always fails")
		case orderedFate(msg.UUID) == failsOnce && attempt == 1:
			return errors.New("faults: this message fails its first attempt")
		}
		d, _ := warren.DeliveryFrom(msg.Context())
		_, lane, isLane := topology.ParseLane(d.RoutingKey)
		if !isLane {
			lane = -1
		}
		line("ok %s %d %d", msg.UUID, time.Now().UnixNano(), lane)
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	return runChild(r, line)
}

// (i) A queue ordered by key: 1,000 keys × 20 messages over orderedLanes lanes, 3 consumer
// processes sharing them; the busiest consumer process is killed with SIGKILL twice (a
// replacement starts each time, and the next fault waits for it to get its share of the
// lanes: see awaitShare) and the broker once. Every message must end processed or
// poisoned, and each key's messages be handled in the order published.
func TestOrderedKill9(t *testing.T) {
	h := newLedger(t, "ordered", orderedKeys*orderedSeqs)
	h.kind, h.fateOf = orderedKind, orderedFate
	h.node = testenv.StartNode(t)
	h.routerURL, h.pubURL = h.node.URL(), h.node.URL()
	h.start = time.Now()
	t.Logf("logs in %s", h.logDir)
	for range orderedProcs {
		h.startConsumer().awaitReady(t)
	}
	h.orderedStream()
	for k, at := range []int{20, 45} {
		h.awaitSent(h.size * at / 100)
		h.during(fmt.Sprintf("kill %d", k+1))
		victim := h.busiest()
		if victim.oks.Load() == 0 {
			t.Fatalf("consumer %s processed nothing before it was to be killed", victim.name)
		}
		h.kill9(victim)
		killed := time.Now()
		h.mark()
		t.Logf("%s: consumer %s killed after %d messages", h.since(), victim.name, victim.oks.Load())
		joiner := h.startConsumer()
		joiner.awaitReady(t)
		h.event("replacement ready")
		h.mu.Lock()
		h.handovers = append(h.handovers, handover{victim: victim.name, joiner: joiner.name, killed: killed, ready: time.Now()})
		h.mu.Unlock()
		h.awaitShare(joiner)
	}
	h.awaitSent(h.size * 70 / 100)
	h.during("broker kill -9")
	h.crashBroker()
	t.Logf("%s: broker killed and booted again", h.since())
	h.finishOrdered()
}

// joinLimit bounds how long the ordered case waits for a replacement process to get its
// share of the lanes before its next fault (see awaitShare); joinStreamLimit is the part of
// the stream (in percent of its messages sent) past which it waits no more, so that the
// faults still happen while messages flow.
const (
	joinLimit       = 30 * time.Second
	joinStreamLimit = 85
)

// awaitShare waits until c has succeeded in its share of the lanes, as laneTimes counts it,
// so that the case's next fault does not fall into the join it measures: a broker's restart
// would count in the join's time, a kill would free lanes for it. Past joinLimit, or once
// joinStreamLimit percent of the stream is sent, it goes on, and says so: laneTimes then
// reports the join as it happened, after the fault.
func (h *harness) awaitShare(c *consumer) {
	share := max(orderedLanes/orderedProcs, 1)
	for deadline := time.Now().Add(joinLimit); ; time.Sleep(50 * time.Millisecond) {
		h.mu.Lock()
		lanes := map[int]bool{}
		for _, e := range h.okEvents {
			if e.consumer == c.name && e.lane >= 0 {
				lanes[e.lane] = true
			}
		}
		h.mu.Unlock()
		if len(lanes) >= share {
			h.event(c.name + " holds its share")
			return
		}
		if time.Now().After(deadline) || h.sent.Load() >= int64(h.size*joinStreamLimit/100) {
			h.t.Logf("%s: consumer %s has no success in %d lanes yet (%d%% of the stream sent); the next fault comes inside its join",
				h.since(), c.name, share, h.sent.Load()*100/int64(h.size))
			h.event(c.name + " still joining")
			return
		}
	}
}

// busiest returns the live consumer process that processed the most messages, a process with
// lanes.
func (h *harness) busiest() *consumer {
	live := h.live()
	return slices.MaxFunc(live, func(a, b *consumer) int { return int(a.oks.Load() - b.oks.Load()) })
}

// orderedStream publishes the ordered stream in the background at orderedRate through a DLX
// publisher that knows the queue's lanes: each of orderedPublishers goroutines owns the keys
// k with k%orderedPublishers == its number and publishes their messages in sequence, round
// robin over its keys, each Publish returned before the next of the same key. A Publish that
// fails is tried again (the same message) until it succeeds or Patience has passed: the key's
// next message is not published before it.
func (h *harness) orderedStream() {
	pub, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: h.pubURL}, Topology: topology.Config{Delay: h.delay},
		Declare: orderedTopology(h.queue)}, h.logger("publisher"))
	if err != nil {
		h.t.Fatalf("dlx.NewPublisher: %v", err)
	}
	h.streamStart = time.Now()
	var ticket atomic.Int64
	var wg sync.WaitGroup
	for g := range orderedPublishers {
		wg.Go(func() {
			for seq := range orderedSeqs {
				for key := g; key < orderedKeys; key += orderedPublishers {
					i := ticket.Add(1) - 1
					time.Sleep(time.Until(h.streamStart.Add(time.Duration(i) * time.Second / orderedRate)))
					h.sent.Add(1)
					id := orderedID(key, seq)
					msg := message.NewMessage(id, []byte("payload of "+id))
					warren.OrderBy(msg, orderedKey(key))
					for first := time.Now(); ; {
						err := pub.Publish(h.queue, msg)
						h.mu.Lock()
						if err == nil {
							h.published[id] = true
							h.pubAt[id] = time.Now()
							h.history[id] = append(h.history[id], h.since()+" published")
						} else {
							h.pubErrs = append(h.pubErrs, err.Error())
							h.history[id] = append(h.history[id], fmt.Sprintf("%s publish failed: %v", h.since(), err))
						}
						h.mu.Unlock()
						if err == nil || time.Since(first) > testenv.Patience() {
							break
						}
						time.Sleep(100 * time.Millisecond)
					}
				}
			}
		})
	}
	go func() {
		wg.Wait()
		_ = pub.Close()
		h.streamEnd = time.Now()
		close(h.streamDone)
	}()
}

// inversion is a message handled after a message of its key with a higher sequence number.
type inversion struct {
	key        string
	seq        int
	after      int // the highest sequence number of the key handled before it
	consumer   string
	afterBy    string // the consumer that handled after
	at, afterT time.Time
}

// orderedCheck takes, per key, the first success of each message (by the time the consumer
// process took as the handler succeeded; later successes of a message are duplicates), and
// returns the messages that succeeded after a message of their key with a higher sequence
// number, the duplicates, and the late ones among them: a success of a message again after
// the first success of a message of its key with a higher sequence number (its effect, done
// twice, done again after a later one's).
func orderedCheck(events []okEvent) (inv []inversion, duplicates, late int) {
	byKey := map[string][]okEvent{}
	for _, e := range events {
		key, _, ok := parseOrderedID(e.id)
		if ok {
			byKey[key] = append(byKey[key], e)
		}
	}
	for key, evs := range byKey {
		sort.SliceStable(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
		seen := map[string]bool{}
		top, topBy, topAt := -1, "", time.Time{}
		for _, e := range evs {
			if seen[e.id] {
				duplicates++
				if _, seq, _ := parseOrderedID(e.id); seq < top {
					late++
				}
				continue
			}
			seen[e.id] = true
			_, seq, _ := parseOrderedID(e.id)
			if seq < top {
				inv = append(inv, inversion{key: key, seq: seq, after: top, consumer: e.consumer, afterBy: topBy, at: e.at, afterT: topAt})
				continue
			}
			top, topBy, topAt = seq, e.consumer, e.at
		}
	}
	sort.Slice(inv, func(i, j int) bool { return inv[i].at.Before(inv[j].at) })
	return inv, duplicates, late
}

// releaseHeld releases, as an operator would, every key held after a poisoned message, once
// the case has settled, and again each key held again by a released message that is
// poisoned in turn, until none is held; it returns how many keys were held when it began,
// and how many releases it asked for. The released messages are handled in the consumers,
// in their keys' order: finishOrdered's checks cover them.
func (h *harness) releaseHeld() (held, releases int) {
	t := h.t
	o, err := ops.New(ops.Config{Connection: warren.Connection{URL: h.node.URL()}}, h.logger("ops"))
	if err != nil {
		t.Fatalf("ops.New: %v", err)
	}
	defer o.Close()
	ctx := context.Background()
	deadline := time.Now().Add(settleLimit)
	for first := true; ; first = false {
		keys, err := o.Held(ctx, h.queue)
		if err != nil {
			t.Fatalf("held keys: %v", err)
		}
		if first {
			held = len(keys)
			t.Logf("%s: %d keys held; releasing them", h.since(), held)
		}
		if len(keys) == 0 {
			return held, releases
		}
		if time.Now().After(deadline) {
			t.Errorf("%d keys still held %s after the first release: %+v", len(keys), settleLimit, keys[:min(len(keys), 3)])
			return held, releases
		}
		for _, k := range keys {
			if k.Action == "" {
				if err := o.ReleaseKey(ctx, h.queue, k.Key); err != nil {
					t.Fatalf("release %q: %v", k.Key, err)
				}
				releases++
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// finishOrdered waits for the case to settle, stops the consumers, counts where every
// message ended and whether each key's messages succeeded in order, prints the case's line
// and fails the test on a loss, an inversion, a stall or messages left in the queues.
func (h *harness) finishOrdered() {
	t := h.t
	m := &monitor{h: h}
	defer m.close()
	stalled := h.settle(m)
	held, releases := h.releaseHeld()
	if stalled == "" {
		stalled = h.settle(m)
	}
	h.stopConsumers()
	h.checkRaces()
	left := h.inQueues()
	_, _, poisonList, unparseable := h.drainPoison() // the ordered ids are not the suite's stream ids: all in poisonList

	h.mu.Lock()
	defer h.mu.Unlock()
	poisoned := map[string]int{}
	for _, id := range poisonList {
		poisoned[id]++
	}
	var lost, wrong, inBoth, foreign []string
	for id := range h.published {
		_, ok := h.oks[id]
		_, p := poisoned[id]
		switch {
		case !ok && !p:
			lost = append(lost, id)
		case ok && p:
			inBoth = append(inBoth, id)
		}
	}
	for id := range poisoned {
		if _, _, mine := parseOrderedID(id); !mine {
			foreign = append(foreign, id)
		} else if orderedFate(id) != failsAlway {
			wrong = append(wrong, id)
		}
	}
	inv, duplicates, late := orderedCheck(h.okEvents)
	invKeys := map[string]bool{}
	for _, i := range inv {
		invKeys[i.key] = true
	}
	stuck, maxCalls, retried := 0, 0, 0
	for _, n := range left {
		stuck += n
	}
	var over []string // messages whose handler ran more than MaxAttempts+1 times
	for id, n := range h.calls {
		maxCalls = max(maxCalls, n)
		if n > maxAttempts+1 {
			over = append(over, id)
		}
		if orderedFate(id) == failsOnce && h.oks[id] > 0 && slices.ContainsFunc(h.callers[id], func(c string) bool { return !strings.HasSuffix(c, " 1") }) {
			retried++
		}
	}
	takeover, join := h.laneTimes()
	line := fmt.Sprintf("faults case=%s published=%d processed=%d poisoned=%d lost=%d inversions=%d duplicates=%d held=%d releases=%d "+
		"takeover_max_ms=%d join_share_max_ms=%d "+
		"late_duplicates=%d poison_dups=%d keys_inverted=%d wrong_poison=%d in_both=%d stuck=%d max_calls=%d over_calls=%d resume_max_ms=%d faults=%d publish_errors=%d "+
		"stalled=%t copy_store=%t rate=%.0f secs=%.0f",
		h.name, len(h.published), len(h.oks), len(poisoned), len(lost), len(inv), duplicates, held, releases,
		takeover.Milliseconds(), join.Milliseconds(), late, len(poisonList)-len(poisoned), len(invKeys), len(wrong), len(inBoth), stuck, maxCalls, len(over), h.resumeMax(), len(h.marks), len(h.pubErrs),
		stalled != "", os.Getenv(orderedNoCopies) == "", float64(h.sent.Load())/h.streamEnd.Sub(h.streamStart).Seconds(), time.Since(h.start).Seconds())
	fmt.Println(line)
	t.Log(line)
	if len(over) > 0 {
		// An attempt retried in place counts in the process only: a process that dies, or
		// loses its channel, in the middle of a message's retries leaves it to the next one,
		// which starts again at attempt 1.
		sort.Slice(over, func(i, j int) bool { return h.calls[over[i]] > h.calls[over[j]] })
		t.Logf("%d messages handled more than MaxAttempts+1 = %d times (reported, not failed); first ones:\n%s",
			len(over), maxAttempts+1, h.histories(over, 5))
	}

	// Nothing may pass vacuously.
	if len(h.published) < h.size*95/100 {
		t.Errorf("only %d of %d messages published: %s", len(h.published), h.size, firsts(h.pubErrs, 3))
	}
	if len(h.okEvents) == 0 || retried == 0 || len(poisoned) == 0 || held == 0 {
		t.Errorf("the stream proved nothing: %d timed successes, %d messages processed after a retry, %d poisoned, %d keys held",
			len(h.okEvents), retried, len(poisoned), held)
	}
	// What the case forbids.
	if stalled != "" {
		t.Errorf("stalled: %s", stalled)
	}
	if len(lost) > 0 {
		sort.Strings(lost)
		t.Errorf("%d messages lost (published, neither processed nor poisoned); %d still in the queues. First ones:\n%s",
			len(lost), stuck, h.histories(lost, 10))
	}
	if len(inv) > 0 {
		var b strings.Builder
		for _, i := range inv[:min(len(inv), 20)] {
			fmt.Fprintf(&b, "  key %s: s%02d ok by %s at %.3fs, after s%02d ok by %s at %.3fs\n", i.key, i.seq, i.consumer,
				i.at.Sub(h.start).Seconds(), i.after, i.afterBy, i.afterT.Sub(h.start).Seconds())
		}
		ids := []string{}
		for _, i := range inv[:min(len(inv), 3)] {
			ids = append(ids, fmt.Sprintf("%s-s%02d", i.key, i.seq), fmt.Sprintf("%s-s%02d", i.key, i.after))
		}
		t.Errorf("%d messages of %d keys handled after a later message of their key (first 20):\n%s%s", len(inv), len(invKeys),
			b.String(), h.histories(ids, len(ids)))
	}
	if stuck > 0 {
		t.Errorf("%d messages left in the queues after the consumers stopped: %v", stuck, left)
	}
	if len(inBoth) > 0 {
		sort.Strings(inBoth)
		t.Errorf("%d messages both processed and poisoned:\n%s", len(inBoth), h.histories(inBoth, 5))
	}
	if len(wrong) > 0 {
		sort.Strings(wrong)
		t.Errorf("%d messages poisoned that fail only once: %s\n%s", len(wrong), firsts(wrong, 10), h.histories(wrong, 5))
	}
	if len(foreign) > 0 || unparseable > 0 {
		t.Errorf("the poison queue holds messages not of the stream: %v (and %d unparseable)", firsts(foreign, 5), unparseable)
	}
	if t.Failed() {
		h.logSummary()
	}
	if dir := os.Getenv("FAULTS_LOGDIR"); dir != "" {
		h.writeOrderedLedger(filepath.Join(dir, h.name, "oks.txt"))
	}
}

// laneTimes measures how fast lanes move, from the timed successes and h.handovers (reported,
// never asserted: a duration). takeover is, over the kills and over the lanes the victim
// handled messages of in the second before it, the longest time from the kill to another
// process's first success in that lane; join is the longest time from a replacement being
// ready to its success in ⌊lanes/processes⌋ lanes, the share every process is sure to get (the
// others give up lanes beyond ⌈lanes/processes⌉), -1 when one never got there.
func (h *harness) laneTimes() (takeover, join time.Duration) {
	share := max(orderedLanes/orderedProcs, 1)
	for _, ho := range h.handovers {
		held := map[int]bool{}
		for _, e := range h.okEvents {
			if e.consumer == ho.victim && e.lane >= 0 && e.at.Before(ho.killed) && e.at.After(ho.killed.Add(-time.Second)) {
				held[e.lane] = true
			}
		}
		for lane := range held {
			first := time.Time{}
			for _, e := range h.okEvents {
				if e.lane == lane && e.consumer != ho.victim && e.at.After(ho.killed) && (first.IsZero() || e.at.Before(first)) {
					first = e.at
				}
			}
			if !first.IsZero() {
				takeover = max(takeover, first.Sub(ho.killed))
			}
		}
		firsts := map[int]time.Time{}
		for _, e := range h.okEvents {
			if e.consumer == ho.joiner && e.lane >= 0 {
				if t, seen := firsts[e.lane]; !seen || e.at.Before(t) {
					firsts[e.lane] = e.at
				}
			}
		}
		var times []time.Time
		for _, t := range firsts {
			times = append(times, t)
		}
		sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
		if len(times) < share {
			join = -time.Millisecond
			continue
		}
		if join >= 0 {
			join = max(join, times[share-1].Sub(ho.ready))
		}
	}
	return takeover, join
}

// writeOrderedLedger writes every timed success, in the consumers' time order, for a look
// after the case (FAULTS_LOGDIR).
func (h *harness) writeOrderedLedger(path string) {
	evs := slices.Clone(h.okEvents)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%.6f %s %s arrival=%d\n", e.at.Sub(h.start).Seconds(), e.consumer, e.id, e.arrival)
	}
	for _, ev := range h.history["."] {
		fmt.Fprintf(&b, "event %s\n", ev)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		h.t.Log(err)
	}
}

// TestOrderedCheck checks the ordered case's counting on a made-up ledger: arrival order does
// not count, the consumers' times do; a message's later successes are duplicates, late when a
// later message of its key succeeded before them.
func TestOrderedCheck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	events := []okEvent{
		{id: "k0001-s02", consumer: "c2", at: at(20)}, // read first, succeeded after s00
		{id: "k0001-s00", consumer: "c1", at: at(10)},
		{id: "k0001-s01", consumer: "c2", at: at(30)}, // after s02: an inversion
		{id: "k0001-s01", consumer: "c3", at: at(40)}, // a duplicate, late (after s02)
		{id: "k0002-s00", consumer: "c1", at: at(10)},
		{id: "k0002-s00", consumer: "c1", at: at(11)}, // a duplicate, not late
		{id: "k0002-s01", consumer: "c1", at: at(12)},
	}
	inv, dups, late := orderedCheck(events)
	if len(inv) != 1 || inv[0].key != "k0001" || inv[0].seq != 1 || inv[0].after != 2 || dups != 2 || late != 1 {
		t.Fatalf("inversions %+v, duplicates %d, late %d; want k0001 s01 after s02, 2, 1", inv, dups, late)
	}
}
