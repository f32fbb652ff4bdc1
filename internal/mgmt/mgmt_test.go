package mgmt_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/mgmt"
	"github.com/warrenmq/warren/internal/testenv"
)

const secret = "s3cr#t/pw"

// The client sends the URL's credentials as basic authentication, escapes a vhost and a
// queue name in the path, takes a 404 for a queue that does not exist, and names the
// broker's reason for a refusal; no error, nor String, shows the password.
func TestClientAsksAndNeverShowsThePassword(t *testing.T) {
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.EscapedPath()+"?"+r.URL.RawQuery)
		user, pass, _ := r.BasicAuth()
		switch {
		case user != "ops" || pass != secret:
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"not_authorised","reason":"Login failed"}`))
		case strings.HasSuffix(r.URL.EscapedPath(), "/missing"):
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":"Object Not Found","reason":"Not Found"}`))
		case strings.HasPrefix(r.URL.EscapedPath(), "/prefix/api/queues/%2F/"):
			_, _ = w.Write([]byte(`{"name":"a b/c","type":"quorum","state":"running","messages":5,"messages_ready":3,
				"messages_unacknowledged":1,"messages_dlx":1,"consumers":3,"online":["n1"],"consumer_details":[
				{"consumer_tag":"t1","channel_details":{"peer_host":"10.0.0.6"}},
				{"consumer_tag":"t2","channel_details":{"peer_host":"10.0.0.5"}},
				{"consumer_tag":"t3","channel_details":{"peer_host":"10.0.0.5"}}]}`))
		default:
			_, _ = w.Write([]byte(`[{"name":"q","type":"quorum","online":[]}]`))
		}
	}))
	defer srv.Close()
	u := strings.Replace(srv.URL, "http://", "http://ops:"+strings.ReplaceAll(secret, "#", "%23")+"@", 1) + "/prefix/"
	u = strings.Replace(u, "/pw@", "%2Fpw@", 1)
	c, err := mgmt.New(u)
	require.NoError(t, err)
	defer c.Close()
	assert.NotContains(t, c.String(), secret)
	assert.Contains(t, c.String(), "ops:xxxxx@")

	q, found, err := c.Queue(t.Context(), "/", "a b/c")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, mgmt.Queue{Name: "a b/c", Type: "quorum", State: "running", Messages: 5, Ready: 3, Unacked: 1,
		DeadLettering: 1, Consumers: 3, Online: []string{"n1"}, ConsumerDetails: q.ConsumerDetails}, q)
	assert.Equal(t, []string{"10.0.0.5 (2)", "10.0.0.6"}, q.ConsumerHosts())
	assert.True(t, q.Serving())
	_, found, err = c.Queue(t.Context(), "/", "missing")
	require.NoError(t, err)
	assert.False(t, found)
	qs, err := c.Queues(t.Context(), "/")
	require.NoError(t, err)
	require.Len(t, qs, 1)
	assert.Equal(t, "down", qs[0].Status(), "a quorum queue no member of which runs")
	assert.False(t, qs[0].Serving())
	assert.Equal(t, "/prefix/api/queues/%2F/a%20b%2Fc?", paths[0])
	assert.Equal(t, "/prefix/api/queues/%2F?columns=", paths[2][:len("/prefix/api/queues/%2F?columns=")])

	wrong, err := mgmt.New(strings.Replace(u, "ops:", "nobody:", 1))
	require.NoError(t, err)
	_, _, err = wrong.Queue(t.Context(), "/", "q")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "401")
	assert.Contains(t, err.Error(), "Login failed")
	assert.ErrorIs(t, err, mgmt.ErrNotAllowed)
	assert.NotContains(t, err.Error(), "s3cr")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://ops:" + strings.ReplaceAll(secret, "#", "%23") + "@" + l.Addr().String() + "/"
	closed = strings.Replace(closed, "/pw@", "%2Fpw@", 1)
	require.NoError(t, l.Close())
	c, err = mgmt.New(closed)
	require.NoError(t, err)
	_, err = c.Queues(t.Context(), "/")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cr")

	for _, bad := range []string{"amqp://ops:" + "s3cret@host/", "http://ops:s3cret@/", "ops:s3cret@host:15672", "http://ops:s3cret@host:x/"} {
		_, err := mgmt.New(bad)
		require.Error(t, err, bad)
		assert.NotContains(t, err.Error(), "s3cret", bad)
	}
}

// A queue's status: the broker's state, else down for a quorum queue none of whose members
// runs, else unknown (no statistics yet).
func TestQueueStatus(t *testing.T) {
	for _, c := range []struct {
		q       mgmt.Queue
		status  string
		serving bool
	}{
		{mgmt.Queue{State: "running"}, "running", true},
		{mgmt.Queue{State: "idle", Type: "classic"}, "idle", true},
		{mgmt.Queue{State: "flow"}, "flow", true},
		{mgmt.Queue{State: "minority", Type: "quorum"}, "minority", false},
		{mgmt.Queue{State: "down"}, "down", false},
		{mgmt.Queue{Type: "quorum", Online: []string{}}, "down", false},
		{mgmt.Queue{Type: "quorum"}, "unknown", false},
		{mgmt.Queue{Type: "classic"}, "unknown", false},
	} {
		assert.Equal(t, c.status, c.q.Status(), "%+v", c.q)
		assert.Equal(t, c.serving, c.q.Serving(), "%+v", c.q)
	}
}

// A consumer's channel_details is an object, or an empty array when the API has no statistics
// of the channel (seen on 3.10.8 while the consumer's channel was new).
func TestConsumerWithoutChannelDetails(t *testing.T) {
	var q mgmt.Queue
	require.NoError(t, json.Unmarshal([]byte(`{"consumer_details":[
		{"consumer_tag":"a","channel_details":[]},
		{"consumer_tag":"b","channel_details":{"peer_host":"10.0.0.7","connection_name":"svc"}}]}`), &q))
	require.Len(t, q.ConsumerDetails, 2)
	assert.Equal(t, mgmt.ChannelDetails{}, q.ConsumerDetails[0].Channel)
	assert.Equal(t, "10.0.0.7", q.ConsumerDetails[1].Channel.PeerHost)
}

// On the broker the tests use (its management API must answer: a missing one fails), a
// queue with a consumer shows its state, messages and its consumer's host; the list has it.
func TestClientOnTheBroker(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	c, err := mgmt.New(testenv.ManagementURL())
	require.NoError(t, err)
	defer c.Close()
	q := env.Queue("mgmt")
	ch := env.Channel()
	_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	for range 3 {
		require.NoError(t, ch.PublishWithContext(t.Context(), "", q, false, false, amqp.Publishing{Body: []byte("x")}))
	}
	require.NoError(t, ch.Qos(1, 0, false))
	_, err = ch.Consume(q, "", false, false, false, false, nil)
	require.NoError(t, err)

	// The broker's statistics arrive every few seconds.
	var got mgmt.Queue
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), testenv.Patience())
		defer cancel()
		var found bool
		got, found, err = c.Queue(ctx, "/", q)
		require.NoError(t, err, "the management API must answer at %s (make broker enables it)", c)
		return found && got.State != "" && got.Unacked == 1 && len(got.ConsumerDetails) == 1
	}, testenv.Patience(), 200*time.Millisecond, "last: %+v", got)
	assert.Equal(t, "running", got.Status())
	assert.Equal(t, 3, got.Messages)
	assert.Equal(t, 2, got.Ready)
	assert.Equal(t, []string{"127.0.0.1"}, got.ConsumerHosts())

	all, err := c.Queues(t.Context(), "/")
	require.NoError(t, err)
	var listed bool
	for _, x := range all {
		if x.Name == q {
			listed = true
			assert.Equal(t, amqp.QueueTypeQuorum, x.Type)
			assert.Equal(t, amqp.QueueTypeQuorum, x.Arguments[amqp.QueueTypeArg])
		}
	}
	assert.True(t, listed, "the list has %s", q)
}

// The nodes of the broker the tests use tell their resources: each runs, with a limit of
// file descriptors and of memory and its free disk; a figure a node does not give is nil,
// not 0. Each quorum queue counts as a member on the node that holds it.
func TestNodesOnTheBroker(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	c, err := mgmt.New(testenv.ManagementURL())
	require.NoError(t, err)
	defer c.Close()
	nodes, err := c.Nodes(t.Context())
	require.NoError(t, err)
	require.NotEmpty(t, nodes)
	names := map[string]bool{}
	for _, n := range nodes {
		names[n.Name] = true
		assert.True(t, n.Running, n.Name)
		for what, v := range map[string]*int64{"fd_used": n.FDUsed, "fd_total": n.FDTotal, "mem_used": n.MemUsed,
			"mem_limit": n.MemLimit, "disk_free": n.DiskFree, "disk_free_limit": n.DiskFreeLimit} {
			if assert.NotNil(t, v, "%s of %s", what, n.Name) {
				assert.Positive(t, *v, "%s of %s", what, n.Name)
			}
		}
		assert.False(t, n.MemAlarm || n.DiskFreeAlarm, "an alarm on %s", n.Name)
	}
	var absent mgmt.Node
	require.NoError(t, json.Unmarshal([]byte(`{"name":"n","running":false}`), &absent))
	assert.Nil(t, absent.FDTotal, "absent is nil")
	assert.Nil(t, absent.SocketsTotal)

	q := env.Queue("members")
	_, err = env.Channel().QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	require.NoError(t, err)
	members, err := c.QuorumMembers(t.Context())
	require.NoError(t, err)
	require.NotEmpty(t, members)
	for n, count := range members {
		assert.True(t, names[n], "%s is a node", n)
		assert.Positive(t, count)
	}
}

// A queue's policy and operator policy, and what they define together, are read with the
// queue and in the list of queues once the broker's statistics have them.
func TestPoliciesOnTheBroker(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	c, err := mgmt.New(testenv.ManagementURL())
	require.NoError(t, err)
	defer c.Close()
	q := env.Queue("policy")
	_, err = env.Channel().QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	require.NoError(t, err)
	testenv.Policy(t, testenv.ManagementURL(), q+".p", false, q, map[string]any{"delivery-limit": 5, "message-ttl": 1000})
	testenv.Policy(t, testenv.ManagementURL(), q+".op", true, q, map[string]any{"max-length": 100})

	var got mgmt.Queue
	require.Eventually(t, func() bool {
		got, _, err = c.Queue(t.Context(), "/", q)
		require.NoError(t, err)
		return got.Policy != "" && got.OperatorPolicy != ""
	}, testenv.Patience(), 200*time.Millisecond, "last: %+v", got)
	assert.Equal(t, q+".p", got.Policy)
	assert.Equal(t, q+".op", got.OperatorPolicy)
	assert.Equal(t, mgmt.Definition{"delivery-limit": 5.0, "message-ttl": 1000.0, "max-length": 100.0}, got.EffectivePolicy)

	all, err := c.Queues(t.Context(), "/")
	require.NoError(t, err)
	var listed bool
	for _, x := range all {
		if x.Name == q {
			listed = true
			assert.Equal(t, got.EffectivePolicy, x.EffectivePolicy)
			assert.Equal(t, q+".p", x.Policy)
		} else if x.EffectivePolicy != nil && x.Policy == "" && x.OperatorPolicy == "" {
			assert.Empty(t, x.EffectivePolicy, "%s has no policy", x.Name)
		}
	}
	assert.True(t, listed)

	var none mgmt.Queue
	require.NoError(t, json.Unmarshal([]byte(`{"policy":null,"operator_policy":null,"effective_policy_definition":[]}`), &none))
	assert.Equal(t, mgmt.Queue{}, none)
}

// An answer of 500 or above is asked again, up to 3 more times; a 4xx is not.
func TestServerErrorsAreAskedAgain(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	failFirst := int32(2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		switch {
		case strings.HasPrefix(r.URL.Path, "/api/queues/") && n <= failFirst, r.URL.Path == "/api/nodes":
			http.Error(w, `{"error":"Internal Server Error","reason":"timeout"}`, http.StatusInternalServerError)
		case r.URL.Path == "/api/connections":
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
		default:
			_, _ = w.Write([]byte(`[]`))
		}
	}))
	t.Cleanup(srv.Close)
	c, err := mgmt.New(srv.URL)
	require.NoError(t, err)
	ctx := context.Background()

	_, err = c.Queues(ctx, "/")
	require.NoError(t, err)
	assert.Equal(t, int32(3), calls.Load())

	calls.Store(0)
	_, err = c.Nodes(ctx)
	require.ErrorContains(t, err, "500 Internal Server Error: timeout")
	assert.Equal(t, int32(4), calls.Load())

	calls.Store(0)
	_, err = c.Connections(ctx)
	require.Error(t, err)
	assert.Equal(t, int32(1), calls.Load())
}
