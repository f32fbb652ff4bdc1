package testenv

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a target and can freeze them (stop forwarding while
// keeping them open: a broker that no longer answers) or drop them (a lost connection).
type Proxy struct {
	l      net.Listener
	target string

	mu     sync.Mutex
	frozen bool
	conns  []net.Conn
	wake   *sync.Cond
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

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

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
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go p.pipe(c, u)
		go p.pipe(u, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		for p.frozen {
			p.wake.Wait()
		}
		p.mu.Unlock()
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
