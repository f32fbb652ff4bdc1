package ui_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/ui"
)

// A service mounts the dashboard under /warren, read-only, beside its own routes; here the
// service is an httptest server, and the page is read as a browser would.
func Example() {
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	o, err := ops.New(ops.Config{Connection: warren.Connection{URL: url}}, nil)
	if err != nil {
		panic(err)
	}
	defer o.Close()
	dash, err := ui.New(ui.Config{Ops: o, Queues: []string{"warren.example.ui.orders"}, Prefix: "/warren"}, nil)
	if err != nil {
		panic(err)
	}
	defer dash.Close()

	mux := http.NewServeMux()
	mux.Handle("/warren/", dash) // behind the service's own authentication, in a real service
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/warren/")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Status)
	fmt.Println(regexp.MustCompile(`<title>(.*)</title>`).FindStringSubmatch(string(page))[1])
	fmt.Println(regexp.MustCompile(`<span class="mode">(.*)</span>`).FindStringSubmatch(string(page))[1])
	fmt.Println(regexp.MustCompile(`<td>(warren.example.ui.orders)</td>\s*<td>(\w+)</td>`).FindStringSubmatch(string(page))[1:])
	// Output:
	// 200 OK
	// Overview · warren
	// read-only
	// [warren.example.ui.orders missing]
}
