package testenv

import (
	"context"
	"strings"
	"testing"

	"github.com/warrenmq/warren/internal/mgmt"
)

// Connections returns the connection_name of every connection that the broker whose
// management API is at mgmtURL (ManagementURL() for the shared broker, Node.ManagementURL()
// for a node started WithManagement) lists with a name that starts with prefix. Give a
// component's warren.Connection.AMQP.Properties["connection_name"] a prefix of the test's
// own (Env.Name) to count its connections. It fails t when the API does not answer.
func Connections(t testing.TB, mgmtURL, prefix string) []string {
	t.Helper()
	c, err := mgmt.New(mgmtURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), Patience())
	defer cancel()
	all, err := c.Connections(ctx)
	if err != nil {
		t.Fatalf("list the broker's connections: %v", err)
	}
	var names []string
	for _, conn := range all {
		if name := conn.ClientProperties.ConnectionName; strings.HasPrefix(name, prefix) {
			names = append(names, name)
		}
	}
	return names
}
