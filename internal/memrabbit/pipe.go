package memrabbit

import (
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// newPipe returns the two ends of an in-memory connection whose writes do not wait for the
// reader (net.Pipe's do): a frame written is buffered, and the writer goes on. Waiting is
// on a sync.Cond, which a testing/synctest bubble sees as durably blocking.
func newPipe() (net.Conn, net.Conn) {
	ab, ba := newStream(), newStream()
	return &pipeEnd{r: ba, w: ab}, &pipeEnd{r: ab, w: ba}
}

// maxKeptBuffer is the largest buffer a stream keeps, once read, for what is written next.
const maxKeptBuffer = 64 << 10

// stream is one direction of a pipe.
type stream struct {
	mu       sync.Mutex
	cond     *sync.Cond
	buf      []byte // written, not yet read from off
	off      int
	closed   bool
	deadline time.Time // of reads; zero: none
	timer    *time.Timer
}

func newStream() *stream {
	s := &stream{}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *stream) read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.off == len(s.buf) {
		switch {
		case s.closed:
			return 0, io.EOF
		case !s.deadline.IsZero() && !time.Now().Before(s.deadline):
			return 0, os.ErrDeadlineExceeded
		}
		s.cond.Wait()
	}
	n := copy(p, s.buf[s.off:])
	s.off += n
	if s.off == len(s.buf) { // all read: written again from the start
		s.buf, s.off = s.buf[:0], 0
		if cap(s.buf) > maxKeptBuffer {
			s.buf = nil // let a large array go
		}
	}
	return n, nil
}

func (s *stream) write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, io.ErrClosedPipe
	}
	if s.off > 0 && s.off >= len(s.buf)/2 { // mostly read: the rest moves to the front
		s.buf, s.off = s.buf[:copy(s.buf, s.buf[s.off:])], 0
	}
	s.buf = append(s.buf, p...)
	s.cond.Broadcast()
	return len(p), nil
}

func (s *stream) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	s.cond.Broadcast()
}

func (s *stream) setDeadline(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deadline = t
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if !t.IsZero() {
		s.timer = time.AfterFunc(time.Until(t), func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.cond.Broadcast()
		})
	}
	s.cond.Broadcast()
}

// pipeEnd is one end of a pipe: it reads r and writes w.
type pipeEnd struct {
	r, w *stream
}

func (p *pipeEnd) Read(b []byte) (int, error)  { return p.r.read(b) }
func (p *pipeEnd) Write(b []byte) (int, error) { return p.w.write(b) }

// Close closes both directions: the other end reads what was written, then EOF.
func (p *pipeEnd) Close() error {
	p.r.close()
	p.w.close()
	return nil
}

func (p *pipeEnd) LocalAddr() net.Addr               { return pipeAddr{} }
func (p *pipeEnd) RemoteAddr() net.Addr              { return pipeAddr{} }
func (p *pipeEnd) SetDeadline(t time.Time) error     { p.r.setDeadline(t); return nil }
func (p *pipeEnd) SetReadDeadline(t time.Time) error { p.r.setDeadline(t); return nil }
func (p *pipeEnd) SetWriteDeadline(time.Time) error  { return nil } // writes never wait
func (pipeAddr) Network() string                     { return "memrabbit" }
func (pipeAddr) String() string                      { return "memrabbit" }

// pipeAddr is the address of both ends.
type pipeAddr struct{}
