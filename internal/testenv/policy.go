package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// Policy sets, through the management API at mgmtURL, a policy called name (an operator
// policy when operator) of the vhost "/" that applies to queue alone (its pattern is
// ^queue$) with definition, and deletes it when t ends. It fails t when the API refuses.
func Policy(t testing.TB, mgmtURL, name string, operator bool, queue string, definition map[string]any) {
	t.Helper()
	kind := "policies"
	if operator {
		kind = "operator-policies"
	}
	path := "api/" + kind + "/%2F/" + url.PathEscape(name)
	body, err := json.Marshal(map[string]any{"pattern": "^" + regexp.QuoteMeta(queue) + "$", "apply-to": "queues",
		"definition": definition, "priority": 0})
	if err != nil {
		t.Fatal(err)
	}
	if err := mgmtCall(mgmtURL, http.MethodPut, path, body); err != nil {
		t.Fatalf("set policy %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := mgmtCall(mgmtURL, http.MethodDelete, path, nil); err != nil {
			t.Errorf("delete policy %s: %v", name, err)
		}
	})
}

// mgmtCall sends method path (escaped, relative to the API's root) with body as JSON to the
// management API at mgmtURL, and fails unless it answers 2xx.
func mgmtCall(mgmtURL, method, path string, body []byte) error {
	u, err := url.Parse(mgmtURL)
	if err != nil {
		return err
	}
	user := u.User
	u.User = nil
	ctx, cancel := context.WithTimeout(context.Background(), Patience())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(u.String(), "/")+"/"+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if user != nil {
		pass, _ := user.Password()
		req.SetBasicAuth(user.Username(), pass)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Close = true // no idle connection left behind
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	return nil
}
