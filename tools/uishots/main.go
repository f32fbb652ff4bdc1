// Command uishots saves screenshots of the dashboard's main pages, driving Chromium: the
// overview, the poison page of a queue, one failure group, a replay's confirmation (the
// count; nothing is replayed), a message, and the topology verified. `make screenshots` runs it against examples/dashboard, into docs/img.
//
//	cd tools && go run ./uishots -url http://127.0.0.1:18080/warren/ -queue Q -out ../docs/img
//
// $WARREN_UI_PASSWORD is admin's password (HTTP basic authentication), if the dashboard
// asks for one.
package main

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

func main() {
	base := flag.String("url", "http://127.0.0.1:18080/warren/", "the dashboard")
	queue := flag.String("queue", "", "the work queue whose poison page is shown")
	out := flag.String("out", "../docs/img", "directory of the PNG files (the default is the repository's docs/img when run from tools/)")
	flag.Parse()
	if err := run(*base, *queue, *out); err != nil {
		fmt.Fprintln(os.Stderr, "uishots:", err)
		os.Exit(1)
	}
}

func run(base, queue, out string) error {
	path, err := exec.LookPath("chromium")
	if err != nil {
		return fmt.Errorf("no chromium: %w (make chromium)", err)
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1280, 800))...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(ctx); err != nil {
		return err
	}
	ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	auth := chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		if _, err := cdp.Call(ctx, t, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		token := base64.StdEncoding.EncodeToString([]byte("admin:" + os.Getenv("WARREN_UI_PASSWORD")))
		_, err := cdp.Call(ctx, t, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": "Basic " + token}})
		return err
	})
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
			if err != nil {
				return err
			}
			file := filepath.Join(out, name+".png")
			fmt.Println(file)
			return os.WriteFile(file, png, 0o644)
		})
	}
	return chromedp.Do(ctx,
		auth,
		chromedp.Navigate(base), chromedp.WaitVisible(`table.queues`), shot("overview"),
		chromedp.Navigate(base+"poison?queue="+url.QueryEscape(queue)), chromedp.WaitVisible(`table.groups`), shot("poison"),
		chromedp.Click(`//table[contains(@class,"groups")]//tr[2]//a[contains(@href,"group=")]`), chromedp.WaitVisible(`//h2[contains(., "Messages")]`),
		shot("group"),
		chromedp.Click(`//button[contains(., "replay what")]`), chromedp.WaitVisible(`//button[contains(., " messages")]`), shot("confirm"),
		chromedp.Navigate(base+"poison?queue="+url.QueryEscape(queue)),
		chromedp.Click(`//table[contains(@class,"messages")]//a[contains(@href,"message?")]`), chromedp.WaitVisible(`pre.body`), shot("message"),
		chromedp.Navigate(base+"topology?verify=1"), chromedp.WaitVisible(`svg.topology`), shot("topology"),
	)
}
