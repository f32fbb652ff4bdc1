package memrabbit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Limits the broker tunes connections to, as RabbitMQ's defaults.
const (
	channelMax = 2047
	frameMax   = 131072
)

// closingTimeout is how long the broker, having answered a client's connection.close, waits
// for the client to close the socket before it closes it itself (RabbitMQ's).
const closingTimeout = 30 * time.Second

// conn is the server's end of one client connection. Frames to the client are written at
// once, in the order they are sent: the pipe's writes never wait for the reader, so the
// broker never waits for a client while it holds its lock.
type conn struct {
	b        *Broker
	nc       net.Conn
	channels map[uint16]*channel // read and written under b.mu

	outMu    sync.Mutex
	out      frameBuffer // what send encodes, under outMu
	ended    bool        // the connection's last frame is written; under outMu
	once     sync.Once
	released bool // its channels and exclusive queues are gone; under b.mu
}

func newConn(b *Broker, nc net.Conn) *conn {
	return &conn{b: b, nc: nc, channels: map[uint16]*channel{}}
}

// send writes frames together, in order, with one write. After the connection's close-ok it
// writes nothing more; after a failed write it writes nothing more and closes the connection
// (on a goroutine of its own: the caller may hold the broker's lock, which close takes).
func (c *conn) send(fs ...frame) {
	c.outMu.Lock()
	defer c.outMu.Unlock()
	if c.ended {
		return
	}
	c.out.b = c.out.b[:0]
	var err error
	for _, f := range fs {
		if err = f.write(&c.out); err != nil {
			break
		}
	}
	if err == nil {
		_, err = c.nc.Write(c.out.b)
	}
	if err != nil || closeOk(fs[0]) {
		c.ended = true
	}
	if err != nil {
		go c.close()
	}
}

// sendMethod sends a method, with its content when it carries one.
func (c *conn) sendMethod(ch uint16, m message) {
	mc, ok := m.(messageWithContent)
	if !ok {
		c.send(&methodFrame{ChannelId: ch, Method: m})
		return
	}
	props, body := mc.getContent()
	fs := []frame{&methodFrame{ChannelId: ch, Method: m}, &headerFrame{ChannelId: ch, ClassId: 60, Size: uint64(len(body)), Properties: props}}
	for len(body) > 0 {
		n := min(len(body), frameMax-frameHeaderSize)
		fs = append(fs, &bodyFrame{ChannelId: ch, Body: body[:n]})
		body = body[n:]
	}
	c.send(fs...)
}

// closeOk reports whether f is connection.close-ok.
func closeOk(f frame) bool {
	mf, ok := f.(*methodFrame)
	if !ok {
		return false
	}
	_, ok = mf.Method.(*connectionCloseOk)
	return ok
}

// close closes the connection, once, and releases what it held.
func (c *conn) close() {
	c.once.Do(func() {
		_ = c.nc.Close()
		c.release()
		c.b.mu.Lock()
		defer c.b.mu.Unlock()
		delete(c.b.conns, c)
	})
}

// release releases what the connection holds, once: its channels' unacked messages go back
// to their queues, its exclusive queues are deleted.
func (c *conn) release() {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.released {
		return
	}
	c.released = true
	for _, ch := range c.channels {
		ch.closeLocked()
	}
	c.channels = map[uint16]*channel{}
	for name, q := range b.queues {
		if q.exclusive == c {
			b.deleteQueueLocked(name)
		}
	}
}

// closeOkThenLinger answers the client's connection.close once the connection's channels
// are released, then, as RabbitMQ, leaves the socket to the client to close (for up to
// closingTimeout), dropping what it still sends: a client that closes its connection sees
// its own close, not the broker's end of the stream.
func (c *conn) closeOkThenLinger(r *reader) {
	c.release()
	c.sendMethod(0, &connectionCloseOk{})
	_ = c.nc.SetReadDeadline(time.Now().Add(closingTimeout))
	_, _ = io.Copy(io.Discard, r.r)
}

// errConnection is a connection error the broker sends before it closes.
type errConnection struct {
	code        uint16
	text        string
	class, meth uint16
}

func (e *errConnection) Error() string { return fmt.Sprintf("connection error %d: %s", e.code, e.text) }

// serve runs the connection: the handshake, then every frame the client sends.
func (c *conn) serve() {
	defer c.close()
	r := reader{r: bufio.NewReader(c.nc)}
	header := make([]byte, 8)
	if _, err := io.ReadFull(r.r, header); err != nil || !bytes.Equal(header, []byte("AMQP\x00\x00\x09\x01")) {
		return
	}
	if err := c.handshake(&r); err != nil {
		return
	}
	for {
		f, err := r.ReadFrame()
		if err != nil {
			return
		}
		if err := c.frame(f); err != nil {
			if errors.Is(err, errClosed) {
				c.closeOkThenLinger(&r)
				return
			}
			var ce *errConnection
			if errors.As(err, &ce) {
				c.sendMethod(0, &connectionClose{ReplyCode: ce.code, ReplyText: ce.text, ClassId: ce.class, MethodId: ce.meth})
			}
			if errors.Is(err, errClosing) || ce != nil {
				c.drainUntilCloseOk(&r)
			}
			return
		}
	}
}

// errClosing says the client sent connection.close-ok unasked.
var errClosing = errors.New("closing")

// errClosed says the client sent connection.close.
var errClosed = errors.New("closed")

// drainUntilCloseOk reads what the client still sends until its close-ok or close.
func (c *conn) drainUntilCloseOk(r *reader) {
	for {
		f, err := r.ReadFrame()
		if err != nil {
			return
		}
		if mf, ok := f.(*methodFrame); ok {
			switch mf.Method.(type) {
			case *connectionCloseOk:
				return
			case *connectionClose:
				c.closeOkThenLinger(r)
				return
			}
		}
	}
}

// handshake: start, start-ok, tune, tune-ok, open, open-ok.
func (c *conn) handshake(r *reader) error {
	c.sendMethod(0, &connectionStart{VersionMajor: 0, VersionMinor: 9, Mechanisms: "PLAIN AMQPLAIN", Locales: "en_US",
		ServerProperties: Table{
			"product": "RabbitMQ", "version": "3.10.8", "platform": "warren memrabbit",
			"capabilities": Table{
				"publisher_confirms": true, "exchange_exchange_bindings": true, "basic.nack": true,
				"consumer_cancel_notify": true, "connection.blocked": true, "consumer_priorities": true,
				"authentication_failure_close": true, "per_consumer_qos": true, "direct_reply_to": true,
			},
		}})
	if _, err := expect[*connectionStartOk](r); err != nil {
		return err
	}
	c.sendMethod(0, &connectionTune{ChannelMax: channelMax, FrameMax: frameMax, Heartbeat: 0})
	if _, err := expect[*connectionTuneOk](r); err != nil {
		return err
	}
	if _, err := expect[*connectionOpen](r); err != nil {
		return err
	}
	c.sendMethod(0, &connectionOpenOk{})
	return nil
}

// expect reads the next frame, which must be method M on channel 0.
func expect[M message](r *reader) (M, error) {
	var zero M
	for {
		f, err := r.ReadFrame()
		if err != nil {
			return zero, err
		}
		if _, ok := f.(*heartbeatFrame); ok {
			continue
		}
		mf, ok := f.(*methodFrame)
		if !ok {
			return zero, fmt.Errorf("handshake: unexpected frame %T", f)
		}
		m, ok := mf.Method.(M)
		if !ok {
			return zero, fmt.Errorf("handshake: unexpected method %T", mf.Method)
		}
		return m, nil
	}
}

// frame handles one frame from the client.
func (c *conn) frame(f frame) error {
	switch f := f.(type) {
	case *heartbeatFrame:
		return nil
	case *methodFrame:
		if f.ChannelId == 0 {
			switch f.Method.(type) {
			case *connectionClose:
				return errClosed
			case *connectionCloseOk:
				return errClosing
			case *connectionBlocked, *connectionUnblocked:
				return nil
			}
			return &errConnection{code: CommandInvalid, text: fmt.Sprintf("COMMAND_INVALID - %T on channel 0", f.Method)}
		}
		return c.method(f.ChannelId, f.Method)
	case *headerFrame:
		return c.content(f.ChannelId, func(ch *channel) error { return ch.header(f) })
	case *bodyFrame:
		return c.content(f.ChannelId, func(ch *channel) error { return ch.body(f.Body) })
	}
	return nil
}

// method handles a method on channel id.
func (c *conn) method(id uint16, m message) error {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := c.channels[id]
	if _, ok := m.(*channelOpen); ok {
		if ch != nil {
			return &errConnection{code: ChannelError, text: fmt.Sprintf("CHANNEL_ERROR - second 'channel.open' seen on channel %d", id)}
		}
		c.channels[id] = newChannel(c, id)
		c.sendMethod(id, &channelOpenOk{})
		return nil
	}
	if ch == nil {
		return &errConnection{code: ChannelError, text: fmt.Sprintf("CHANNEL_ERROR - expected 'channel.open' on channel %d", id)}
	}
	if ch.closing {
		if _, ok := m.(*channelCloseOk); ok {
			delete(c.channels, id)
		}
		return nil // after the broker closed the channel, everything but close-ok is dropped
	}
	return ch.method(m)
}

// content hands a content frame to its channel: a channel error closes the channel, as one of
// the basic.publish the content belongs to.
func (c *conn) content(id uint16, do func(*channel) error) error {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := c.channels[id]
	if ch == nil || ch.closing {
		return nil
	}
	classID, methodID := (&basicPublish{}).id()
	return ch.failed(do(ch), classID, methodID)
}
