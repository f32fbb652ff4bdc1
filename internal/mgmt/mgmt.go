// Package mgmt reads RabbitMQ's management HTTP API (the rabbitmq_management plugin) for
// what AMQP 0-9-1 does not tell: a queue's state, its unacknowledged messages, the messages
// a quorum queue is dead-lettering, the hosts of its consumers, the policies that apply to
// it, the list of queues, the client connections, and the nodes' resources and alarms.
package mgmt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/warrenmq/warren/internal/amqpurl"
)

// ErrNotAllowed is wrapped by the error of a request the API refused the user (401 or 403):
// a wrong password, or a user without the tag the resource needs (the nodes need
// "monitoring").
var ErrNotAllowed = errors.New("not allowed")

// Client reads one broker's management API. Its errors never contain the password of the
// URL it was made with.
type Client struct {
	base       *url.URL // the URL without its user info
	user, pass string
	redacted   string
	http       *http.Client
}

// New returns a Client of the API at raw, an http or https URL with the user's credentials:
// "http://guest:guest@127.0.0.1:15672/" (a path, if any, is where the API is served: the
// management plugin's path prefix). The error never contains the password.
func New(raw string) (*Client, error) {
	redacted := amqpurl.Redact(raw)
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("management URL %s does not parse", redacted)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("management URL %s: want http:// or https://", redacted)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("management URL %s: no host", redacted)
	}
	c := &Client{redacted: redacted, http: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}
	if u.User != nil {
		c.user = u.User.Username()
		c.pass, _ = u.User.Password()
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	u.Path, u.RawPath = strings.TrimSuffix(u.Path, "/"), strings.TrimSuffix(u.RawPath, "/")
	c.base = u
	return c, nil
}

// Close closes the client's idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// String is the URL without its password.
func (c *Client) String() string { return c.redacted }

// Queue is what the API tells of a queue. Fields the broker has no statistics for yet (a
// queue declared a moment ago, or one that is down) are zero.
type Queue struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// State is the broker's: running, idle or flow when it serves messages; down, minority,
	// crashed, stopped, ... when not; "" when the broker gave none (see Status).
	State string `json:"state"`
	// Messages is every message of the queue: Ready, Unacked, and DeadLettering.
	Messages int `json:"messages"`
	Ready    int `json:"messages_ready"`
	Unacked  int `json:"messages_unacknowledged"`
	// DeadLettering is the number of messages a quorum queue has expired or rejected and
	// not yet seen confirmed by the queue they are dead-lettered to (at-least-once).
	DeadLettering int `json:"messages_dlx"`
	Consumers     int `json:"consumers"`
	// Online lists the nodes whose member of a quorum queue runs; nil for other types.
	Online []string `json:"online"`
	// Members lists the nodes that hold a member of a quorum queue; nil for other types.
	Members   []string       `json:"members"`
	Arguments map[string]any `json:"arguments"`
	// Policy and OperatorPolicy name the policy and the operator policy that apply to the
	// queue, "" for none; EffectivePolicy is what they define together (the keys of both,
	// the operator policy's winning where it is stricter). The broker fills them with its
	// statistics: a few seconds after the queue or the policy appeared.
	Policy          string     `json:"policy"`
	OperatorPolicy  string     `json:"operator_policy"`
	EffectivePolicy Definition `json:"effective_policy_definition"`
	// ConsumerDetails is filled by Client.Queue only.
	ConsumerDetails []Consumer `json:"consumer_details"`
}

// Definition is a policy's definition: its keys ("delivery-limit", "message-ttl", ...) and
// their values, as JSON decodes them (numbers are float64).
type Definition map[string]any

// UnmarshalJSON reads an object, or the empty array the API may give for an empty
// definition.
func (d *Definition) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '[' {
		*d = nil
		return nil
	}
	return json.Unmarshal(b, (*map[string]any)(d))
}

// Consumer is one consumer of a queue.
type Consumer struct {
	Tag     string         `json:"consumer_tag"`
	Channel ChannelDetails `json:"channel_details"`
}

// ChannelDetails is the channel of a consumer. The API gives an empty array instead of an
// object when it has no statistics of the channel (yet, or any more): that reads as zero.
type ChannelDetails struct {
	// PeerHost is the address of the consumer's connection, as the broker sees it.
	PeerHost       string `json:"peer_host"`
	ConnectionName string `json:"connection_name"`
}

// UnmarshalJSON reads an object, or the empty array the API gives for a channel it has no
// statistics of.
func (c *ChannelDetails) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '[' {
		*c = ChannelDetails{}
		return nil
	}
	type plain ChannelDetails
	return json.Unmarshal(b, (*plain)(c))
}

// Status is the queue's state as one word: State, or, when the broker gave none, "down"
// for a quorum queue none of whose members runs, else "unknown" (no statistics yet).
func (q Queue) Status() string {
	switch {
	case q.State != "":
		return q.State
	case q.Type == "quorum" && q.Online != nil && len(q.Online) == 0:
		return "down"
	}
	return "unknown"
}

// Serving reports whether the broker says the queue serves messages (running, idle or flow).
func (q Queue) Serving() bool {
	switch q.Status() {
	case "running", "idle", "flow":
		return true
	}
	return false
}

// ConsumerHosts lists the hosts of the queue's consumers, each once, with how many
// consumers it has when more than one ("10.0.0.5 (3)"), in order.
func (q Queue) ConsumerHosts() []string {
	counts := map[string]int{}
	for _, c := range q.ConsumerDetails {
		counts[c.Channel.PeerHost]++
	}
	var hosts []string
	for h, n := range counts {
		if n > 1 {
			h = fmt.Sprintf("%s (%d)", h, n)
		}
		hosts = append(hosts, h)
	}
	slices.Sort(hosts)
	return hosts
}

// queueColumns are the fields Queues asks for.
const queueColumns = "name,type,state,messages,messages_ready,messages_unacknowledged,messages_dlx,consumers,online,members,arguments," +
	"policy,operator_policy,effective_policy_definition"

// Queues lists the queues of virtual host vhost.
func (c *Client) Queues(ctx context.Context, vhost string) ([]Queue, error) {
	var qs []Queue
	_, err := c.get(ctx, "/api/queues/"+url.PathEscape(vhost), url.Values{"columns": {queueColumns}}, &qs)
	return qs, err
}

// Queue returns queue name of virtual host vhost, with its consumers, and whether it exists.
func (c *Client) Queue(ctx context.Context, vhost, name string) (Queue, bool, error) {
	var q Queue
	found, err := c.get(ctx, "/api/queues/"+url.PathEscape(vhost)+"/"+url.PathEscape(name), nil, &q)
	return q, found, err
}

// QuorumMembers counts, per node, the members of quorum queues it holds, of every virtual
// host: on RabbitMQ 3.x each holds file handles of the node's.
func (c *Client) QuorumMembers(ctx context.Context) (map[string]int, error) {
	var qs []Queue
	if _, err := c.get(ctx, "/api/queues", url.Values{"columns": {"type,members"}}, &qs); err != nil {
		return nil, err
	}
	members := map[string]int{}
	for _, q := range qs {
		if q.Type != "quorum" {
			continue
		}
		for _, n := range q.Members {
			members[n]++
		}
	}
	return members, nil
}

// Node is what the API tells of one node of the cluster. A figure the node did not give is
// nil: RabbitMQ 4.x gives no socket figures (or 0), and a node that is not running gives
// none at all.
type Node struct {
	Name    string `json:"name"`
	Running bool   `json:"running"`
	// FDUsed and FDTotal are the file descriptors the node's process has open (as the
	// operating system counts them) and may have. On RabbitMQ 3.x the node's file handle
	// cache reserves handles beyond the ones open (three per quorum queue): FDUsed does not
	// show them.
	FDUsed  *int64 `json:"fd_used"`
	FDTotal *int64 `json:"fd_total"`
	// SocketsUsed and SocketsTotal are the sockets (client connections) the node has and may
	// have: RabbitMQ 3.x only.
	SocketsUsed  *int64 `json:"sockets_used"`
	SocketsTotal *int64 `json:"sockets_total"`
	// MemUsed and MemLimit are its memory and its high watermark, in bytes.
	MemUsed  *int64 `json:"mem_used"`
	MemLimit *int64 `json:"mem_limit"`
	// DiskFree and DiskFreeLimit are its free disk space and the floor under which the disk
	// alarm goes off, in bytes.
	DiskFree      *int64 `json:"disk_free"`
	DiskFreeLimit *int64 `json:"disk_free_limit"`
	// MemAlarm and DiskFreeAlarm are its resource alarms: while one is on, the broker blocks
	// every connection that publishes.
	MemAlarm      bool `json:"mem_alarm"`
	DiskFreeAlarm bool `json:"disk_free_alarm"`
}

// nodeColumns are the fields Nodes asks for.
const nodeColumns = "name,running,fd_used,fd_total,sockets_used,sockets_total,mem_used,mem_limit,disk_free,disk_free_limit," +
	"mem_alarm,disk_free_alarm"

// Nodes lists the nodes of the cluster.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	var ns []Node
	_, err := c.get(ctx, "/api/nodes", url.Values{"columns": {nodeColumns}}, &ns)
	return ns, err
}

// Connection is one client connection to the broker.
type Connection struct {
	// Name is the broker's name of the connection: "127.0.0.1:40102 -> 127.0.0.1:5672".
	Name string `json:"name"`
	// ClientProperties holds connection_name, the name the client gave it (warren's, with
	// the prefix of warren.Connection.AMQP.Properties["connection_name"]).
	ClientProperties struct {
		ConnectionName string `json:"connection_name"`
	} `json:"client_properties"`
	// State is "running", "blocked", "blocking", "flow", ...
	State string `json:"state"`
}

// Connections lists the broker's client connections, of every virtual host.
func (c *Client) Connections(ctx context.Context) ([]Connection, error) {
	var cs []Connection
	_, err := c.get(ctx, "/api/connections", url.Values{"columns": {"name,client_properties.connection_name,state"}}, &cs)
	return cs, err
}

// get decodes the JSON answer to GET path into v, and reports false for a 404. An answer of
// 500 or above is the API's own trouble (on a loaded node its statistics database answered
// 500 to a list of queues): the request is made again, up to 3 more times, backing off from
// 100 ms, within ctx.
func (c *Client) get(ctx context.Context, path string, query url.Values, v any) (bool, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	var found bool
	err := backoff.Retry(func() (err error) {
		found, err = c.getOnce(ctx, path, query, v)
		return err
	}, backoff.WithContext(backoff.WithMaxRetries(b, 3), ctx))
	return found, err
}

// getOnce is one request of get; an error that asking again cannot change is
// backoff.Permanent.
func (c *Client) getOnce(ctx context.Context, path string, query url.Values, v any) (bool, error) {
	target := c.base.String() + path // path is escaped already (a vhost "/" is %2F)
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return false, backoff.Permanent(fmt.Errorf("management API %s: %w", c.redacted, err))
	}
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its URL holds no password, but the one above says where already
		}
		return false, backoff.Permanent(fmt.Errorf("management API %s: GET %s: %w", c.redacted, path, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		_, _ = io.Copy(io.Discard, resp.Body)
		return false, nil
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error, Reason string }
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		why := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Reason != "" {
			why = e.Reason
		}
		err := fmt.Errorf("management API %s: GET %s: %s: %s", c.redacted, path, resp.Status, why)
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			err = fmt.Errorf("%w (%w)", err, ErrNotAllowed)
		}
		if resp.StatusCode < http.StatusInternalServerError {
			err = backoff.Permanent(err)
		}
		return false, err
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return false, backoff.Permanent(fmt.Errorf("management API %s: GET %s: %w", c.redacted, path, err))
	}
	return true, nil
}
