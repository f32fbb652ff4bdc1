package testenv

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	neturl "net/url"
	"strings"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a target and can freeze them (stop forwarding while
// keeping them open: a broker that no longer answers), drop them (a lost connection) or
// cancel consumers as the broker does (basic.cancel: a queue's node went down).
type Proxy struct {
	l      net.Listener
	target string

	mu       sync.Mutex
	accepted int
	frozen   bool
	conns    []net.Conn
	wake     *sync.Cond
	streams  []*toClient
	cancels  int // basic.cancel frames read from the broker
}

// toClient is the broker-to-client direction of one proxied connection, forwarded frame by
// frame so that frames can be added between them.
type toClient struct {
	mu        sync.Mutex
	dst       net.Conn
	consumers map[string]uint16 // consumer tag -> channel, from basic.consume-ok
}

// NewProxy listens on a free local port and forwards to target (host:port) until t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &Proxy{l: l, target: target}
	p.wake = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// ProxyURL starts a proxy to the broker of url (see NewProxy) and returns it with url
// pointed at it.
func ProxyURL(t testing.TB, url string) (*Proxy, string) {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := NewProxy(t, u.Host)
	return p, WithHost(t, url, p.Addr())
}

// WithHost returns url with its host:port replaced by addr.
func WithHost(t testing.TB, url, addr string) string {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatalf("%v", err)
	}
	u.Host = addr
	return u.String()
}

// awaitThaw returns once the proxy is not frozen.
func (p *Proxy) awaitThaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.frozen {
		p.wake.Wait()
	}
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Accepted is how many connections the proxy has accepted: how many times a client dialled.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Freeze stops forwarding bytes in both directions; connections stay open.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// Thaw forwards again.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	p.frozen = false
	p.wake.Broadcast()
	p.mu.Unlock()
}

// Drop closes every connection made so far.
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Close stops listening and drops every connection.
func (p *Proxy) Close() {
	_ = p.l.Close()
	p.Thaw()
	p.Drop()
}

func (p *Proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepted++
		p.mu.Unlock()
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		tc := &toClient{dst: c, consumers: map[string]uint16{}}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.streams = append(p.streams, tc)
		p.mu.Unlock()
		go p.frames(tc, u)
		go p.pipe(u, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.awaitThaw()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or closed
			return
		}
	}
}

// BrokerCancels is how many basic.cancel frames the broker has sent through the proxy (also
// while it is frozen: they are counted when they reach the proxy, before they are
// forwarded).
func (p *Proxy) BrokerCancels() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cancels
}

// CancelConsumers sends basic.cancel, as the broker does when a consumer's queue becomes
// unavailable, to every consumer whose tag starts with prefix, and returns how many it sent.
// The broker itself is not told: the client's consumer is gone, the broker's stays until the
// client closes its channel.
func (p *Proxy) CancelConsumers(prefix string) int {
	p.mu.Lock()
	streams := append([]*toClient(nil), p.streams...)
	p.mu.Unlock()
	n := 0
	for _, tc := range streams {
		tc.mu.Lock()
		for tag, channel := range tc.consumers {
			if !strings.HasPrefix(tag, prefix) {
				continue
			}
			args := append([]byte{0, 60, 0, 30, byte(len(tag))}, tag...) // basic.cancel
			args = append(args, 1)                                       // no-wait
			frame := []byte{1, byte(channel >> 8), byte(channel)}
			frame = binary.BigEndian.AppendUint32(frame, uint32(len(args)))
			frame = append(append(frame, args...), 0xCE)
			if _, err := tc.dst.Write(frame); err == nil {
				n++
			}
			delete(tc.consumers, tag)
		}
		tc.mu.Unlock()
	}
	return n
}

// frames forwards src to tc.dst frame by frame (a frame is written whole, under tc.mu, so
// CancelConsumers can add one between two), noting the consumers from basic.consume-ok.
func (p *Proxy) frames(tc *toClient, src net.Conn) {
	defer tc.dst.Close()
	defer src.Close()
	r := bufio.NewReaderSize(src, 64<<10)
	for {
		hdr, err := r.Peek(7)
		if err != nil {
			return
		}
		frame := make([]byte, 7+int(binary.BigEndian.Uint32(hdr[3:7]))+1)
		if _, err := io.ReadFull(r, frame); err != nil {
			return
		}
		if payload := frame[7 : len(frame)-1]; frame[0] == 1 && len(payload) >= 4 &&
			binary.BigEndian.Uint16(payload) == 60 && binary.BigEndian.Uint16(payload[2:]) == 30 { // basic.cancel
			p.mu.Lock()
			p.cancels++
			p.mu.Unlock()
		}
		p.awaitThaw()
		tc.mu.Lock()
		if payload := frame[7 : len(frame)-1]; frame[0] == 1 && len(payload) > 5 &&
			binary.BigEndian.Uint16(payload) == 60 && binary.BigEndian.Uint16(payload[2:]) == 21 { // basic.consume-ok
			if n := int(payload[4]); len(payload) >= 5+n {
				tc.consumers[string(payload[5:5+n])] = binary.BigEndian.Uint16(frame[1:3])
			}
		}
		_, err = tc.dst.Write(frame)
		tc.mu.Unlock()
		if err != nil {
			return
		}
	}
}
