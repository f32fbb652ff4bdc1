package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
)

// syncBuffer is a bytes.Buffer that a command writes from several goroutines (its logger's
// among them) while a test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// serveUI runs warren ui with args on a port of its own until the test ends, and returns
// the address of the dashboard it prints.
func serveUI(t *testing.T, env *testenv.Env, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	root := newRoot()
	out := &syncBuffer{}
	root.SetOut(out)
	root.SetErr(out)
	root.SetArgs(cliArgs(env.URL, append([]string{"ui", "--listen", "127.0.0.1:0", "--queue", env.Queue("ui")}, args...)...))
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	started := regexp.MustCompile(`dashboard on (http://\S+) `)
	var url string
	require.Eventually(t, func() bool {
		m := started.FindStringSubmatch(out.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, testenv.Patience(), 10*time.Millisecond, "warren ui did not start: %s", out)
	return url
}

// warren ui serves the dashboard under /warren/ by default, as a service mounts it, and
// redirects / there; --path "" serves it at /.
func TestUIServesUnderWarrenByDefault(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(url string) *http.Response {
		t.Helper()
		res, err := client.Get(url)
		require.NoError(t, err)
		_ = res.Body.Close()
		return res
	}

	url := serveUI(t, env)
	require.Regexp(t, `^http://127\.0\.0\.1:\d+/warren/$`, url)
	assert.Equal(t, http.StatusOK, get(url).StatusCode)
	base := strings.TrimSuffix(url, "warren/")
	root := get(base)
	assert.Equal(t, http.StatusFound, root.StatusCode)
	assert.Equal(t, "/warren/", root.Header.Get("Location"))
	assert.Equal(t, http.StatusNotFound, get(base+"other").StatusCode)

	url = serveUI(t, env, "--path", "")
	require.Regexp(t, `^http://127\.0\.0\.1:\d+/$`, url)
	assert.Equal(t, http.StatusOK, get(url).StatusCode)
}

// warren ui --postgres --schema shows the outbox: its figures on the overview, its page of
// the rows set aside.
func TestUIShowsTheOutbox(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	pool, schema := testenv.Postgres(t)
	setAside(t, pool, schema, 2, "refused by the broker")
	url := serveUI(t, env, "--postgres", testenv.PostgresURL(), "--schema", schema)
	get := func(path string) string {
		t.Helper()
		res, err := http.Get(url + path)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode, string(body))
		return string(body)
	}
	assert.Contains(t, get(""), "<h2>Outbox <small>"+schema+"</small></h2>")
	assert.Contains(t, get("outbox"), `<td class="err">refused by the broker</td>`)
}
