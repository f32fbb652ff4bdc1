package ui_test

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
	"github.com/warrenmq/warren/ui"
)

// Browser tests drive the system's Chromium (Debian's chromium package; .ci/run installs
// it): a missing browser fails them. A failed step saves a screenshot in
// $WARREN_UI_FAILURES (default: the test's temporary directory, kept when it fails, under
// the system's temporary directory) and names it. With $WARREN_UI_SCREENSHOTS set, the main
// pages are saved there as PNG files too (make screenshots: docs/img).

// chromium returns a browser context, closed when the test ends.
func chromium(t *testing.T) context.Context {
	t.Helper()
	testenv.NeedsBroker(t)
	path := os.Getenv("WARREN_CHROMIUM")
	if path == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if p, err := exec.LookPath(name); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		t.Fatal("no Chromium to drive: install Debian's chromium package (apt-get install chromium), or set $WARREN_CHROMIUM")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 1000), chromedp.Flag("lang", "en"))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*testenv.Patience())
	t.Cleanup(func() {
		cancelTimeout()
		cancel()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Do(ctx), "start %s", path)
	return ctx
}

// step runs actions; if they fail, it saves a screenshot of the page and fails the test.
func step(ctx context.Context, t *testing.T, name string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, testenv.Patience())
	defer cancel()
	if err := chromedp.Do(sctx, actions...); err != nil {
		failed(ctx, t, name, err)
	}
}

// read returns the text of the first element sel (XPath or CSS) finds, once visible.
func read(ctx context.Context, t *testing.T, name, sel string) string {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, testenv.Patience())
	defer cancel()
	s, err := chromedp.Run(sctx, chromedp.Text(sel))
	// A node found and then replaced before its text is read (the document of a form's
	// answer still settling): read it again from the selector.
	for err != nil && strings.Contains(err.Error(), "No node with given id found") && sctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		s, err = chromedp.Run(sctx, chromedp.Text(sel))
	}
	if err != nil {
		failed(ctx, t, name, err)
	}
	return s
}

// failed saves a screenshot of the page and fails the test.
func failed(ctx context.Context, t *testing.T, name string, err error) {
	t.Helper()
	dir := os.Getenv("WARREN_UI_FAILURES")
	if dir == "" {
		dir = os.TempDir()
	}
	file := filepath.Join(dir, "warren-ui-"+strings.ReplaceAll(t.Name(), "/", "_")+"-"+strings.ReplaceAll(name, " ", "_")+".png")
	shot, cancelShot := context.WithTimeout(ctx, testenv.Patience())
	defer cancelShot()
	if png, serr := chromedp.Run(shot, chromedp.FullScreenshot(100)); serr == nil && os.WriteFile(file, png, 0o644) == nil {
		t.Fatalf("%s: %v (screenshot: %s)", name, err, file)
	}
	t.Fatalf("%s: %v (no screenshot)", name, err)
}

// shoot saves the page as $WARREN_UI_SCREENSHOTS/name.png when that is set.
func shoot(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	dir := os.Getenv("WARREN_UI_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

// An operator finds the failures, replays one group with the confirmation, sees the counts
// change, and kills and resumes the queue, from the pages alone, in Chromium.
func TestBrowserOperatorFlow(t *testing.T) {
	t.Parallel()
	ctx := chromium(t)
	env := testenv.New(t)
	q := env.WorkQueue("browser")
	poison(t, env, q, 10)
	k, err := kill.NewKiller(kill.Config{Connection: env.Connection(), Wait: 300 * time.Millisecond}, nil)
	require.NoError(t, err)
	o, err := ops.New(ops.Config{Connection: warren.Connection{URL: env.URL}}, nil)
	require.NoError(t, err)
	defer o.Close()
	h, err := ui.New(ui.Config{Ops: o, Killer: k, Queues: []string{q}, AllowActions: true, Prefix: "/warren",
		SampleInterval: 100 * time.Millisecond}, nil)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer func() {
		srv.Close()
		require.NoError(t, h.Close())
	}()
	base := srv.URL + "/warren"

	const poisonLink = `//table[contains(@class,"queues")]//a[contains(@href,"poison?queue=")]`
	step(ctx, t, "overview", chromedp.Navigate(base+"/"), chromedp.WaitVisible(`table.queues`))
	require.Equal(t, "10", read(ctx, t, "overview", poisonLink))
	// The line on top names what is wrong, and the queue's row is marked where.
	require.Contains(t, read(ctx, t, "problems", `#problems`), "To look at: "+q+": 10 poison messages, no consumer")
	const markedRow = `//table[contains(@class,"queues")]//tr[contains(concat(" ", @class, " "), " problem ")]`
	step(ctx, t, "the row marked",
		chromedp.WaitVisible(markedRow+`/td[contains(@class,"flag")]/a[contains(@href,"poison?queue=")]`),
		chromedp.WaitVisible(markedRow+`/td[5][contains(@class,"flag")]`)) // no consumer
	time.Sleep(300 * time.Millisecond) // a few samples for the charts
	step(ctx, t, "overview again", chromedp.Reload(), chromedp.WaitVisible(`svg.chart`))
	shoot(ctx, t, "overview")

	step(ctx, t, "poison page",
		chromedp.Click(poisonLink),
		chromedp.WaitVisible(`table.groups`))
	shoot(ctx, t, "poison")
	step(ctx, t, "filter a group",
		chromedp.Click(`//table[contains(@class,"groups")]//tr[td[contains(., "not found")]]//a[contains(@href,"group=")]`),
		chromedp.WaitVisible(`//p[contains(., "the filter selects 5")]`))

	group, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	step(ctx, t, "message detail",
		chromedp.Click(`//table[contains(@class,"messages")]//a[contains(@href,"message?")]`),
		chromedp.WaitVisible(`pre.body`))
	shoot(ctx, t, "message")
	step(ctx, t, "back to the group", chromedp.Navigate(group), chromedp.WaitVisible(`//button[contains(., "replay what the filter selects")]`))

	step(ctx, t, "replay: the count",
		chromedp.Click(`//button[contains(., "replay what the filter selects")]`),
		chromedp.WaitVisible(`//p[contains(., "selects 5 of the 10 messages")]`))
	shoot(ctx, t, "confirm")
	step(ctx, t, "replay: confirmed",
		chromedp.Click(`//button[contains(., "replay 5 messages")]`),
		chromedp.WaitVisible(`//div[@id="job"]//p[contains(., "finished")]`)) // htmx follows the job
	require.Equal(t, "5", read(ctx, t, "replayed", `//div[@id="job"]//td[@class="done"]`))
	shoot(ctx, t, "job")

	step(ctx, t, "overview after the replay", chromedp.Navigate(base+"/"))
	require.Equal(t, "5", read(ctx, t, "overview after the replay", poisonLink))
	require.Equal(t, 5, depth(t, env, q))

	step(ctx, t, "kill",
		chromedp.Click(`//table[contains(@class,"queues")]//button[.="kill"]`),
		chromedp.WaitVisible(`//h1[contains(., "stop")]`),
		chromedp.Navigate(base+"/"))
	killState := read(ctx, t, "kill state", `//table[contains(@class,"queues")]//tbody/tr/td[6]`)
	require.True(t, strings.HasPrefix(killState, "stop "), killState)
	require.Contains(t, read(ctx, t, "problems", `#problems`), q+": 5 poison messages, killed (stop)")
	step(ctx, t, "resume",
		chromedp.Click(`//table[contains(@class,"queues")]//button[.="resume"]`),
		chromedp.WaitVisible(`//h1[contains(., "resume")]`),
		chromedp.Navigate(base+"/"))
	killState = read(ctx, t, "kill state", `//table[contains(@class,"queues")]//tbody/tr/td[6]`)
	require.True(t, strings.HasPrefix(killState, "resume "), killState)
	require.Equal(t, 5, depth(t, env, topology.PoisonQueue(q)))
}

// The overview's refresh (htmx, every 10 s) shows a broker that went away: the error and the
// last values read, in place of the page it had.
func TestBrowserOverviewShowsABrokerThatWentAway(t *testing.T) {
	t.Parallel()
	ctx := chromium(t)
	env := testenv.New(t)
	q := env.WorkQueue("went-away")
	proxy, url := testenv.ProxyURL(t, env.URL)
	o, err := ops.New(ops.Config{Connection: warren.Connection{URL: url, ConnectTimeout: time.Second}, Timeout: time.Second}, nil)
	require.NoError(t, err)
	defer o.Close()
	h, err := ui.New(ui.Config{Ops: o, Queues: []string{q}, SampleInterval: -1, Timeout: 2 * time.Second}, nil)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer func() {
		srv.Close()
		require.NoError(t, h.Close())
	}()
	step(ctx, t, "overview", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(`table.queues`))
	proxy.Close()
	step(ctx, t, "refreshed", chromedp.WaitVisible(`//div[@id="overview"]//p[contains(., "Showing the last values read")]`))
	require.Contains(t, read(ctx, t, "error", `//div[@id="overview"]//p[@class="error"]`), "cannot read the broker: ")
	require.Equal(t, q, read(ctx, t, "queue", `//table[contains(@class,"queues")]//tbody/tr/td[1]`))
}
