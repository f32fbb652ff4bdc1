package amqpx

import (
	"net"
	"sync"
	"time"
)

// maxUnwritten bounds the bytes a batchConn holds: a Write beyond it waits, so that a broker
// that stops reading (flow control, a black hole) still stops the writers.
const maxUnwritten = 256 << 10

// closeFlushTimeout bounds how long Close lets the bytes already written go out (amqp091
// answers the broker's connection.close and then closes the socket at once).
const closeFlushTimeout = 100 * time.Millisecond

// BatchConn returns conn with its writes gathered: Write copies p and returns, and one
// goroutine writes everything gathered so far to conn in one system call.
//
// amqp091-go flushes every frame set (a publish is three frames, an ack one) with a system
// call of its own, under the connection's write lock: with many publishings or acks in
// flight, those system calls are most of the client's work. Gathered, the frames written
// while one system call runs go out together in the next; an idle connection writes each
// at once, as before. A failed write closes conn, so amqp091's reader fails too and closes
// the connection: nothing written after the failure is confirmed or acked.
func BatchConn(conn net.Conn) net.Conn {
	b := &batchConn{Conn: conn}
	b.cond = sync.NewCond(&b.mu)
	go b.writeLoop()
	return b
}

type batchConn struct {
	net.Conn

	mu         sync.Mutex
	cond       *sync.Cond // broadcast when bytes are gathered or written, and when err is set
	buf, spare []byte     // gathered; the buffer last written, for reuse
	writing    bool
	err        error // a write failed, or Close was called
}

// Write gathers p, waiting while maxUnwritten bytes are gathered already. It returns the
// error of an earlier write, if one failed.
func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.err == nil && len(b.buf) >= maxUnwritten {
		b.cond.Wait()
	}
	if b.err != nil {
		return 0, b.err
	}
	b.buf = append(b.buf, p...)
	b.cond.Broadcast()
	return len(p), nil
}

func (b *batchConn) writeLoop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		for b.err == nil && len(b.buf) == 0 {
			b.cond.Wait()
		}
		if b.err != nil {
			return
		}
		data := b.buf
		b.buf, b.spare, b.writing = b.spare[:0], nil, true
		b.mu.Unlock()
		_, err := b.Conn.Write(data)
		if err != nil {
			_ = b.Conn.Close()
		}
		b.mu.Lock()
		b.spare, b.writing = data[:0], false
		if err != nil && b.err == nil {
			b.err = err
		}
		b.cond.Broadcast()
	}
}

// Close lets the gathered bytes go out for up to closeFlushTimeout, then closes conn.
func (b *batchConn) Close() error {
	b.mu.Lock()
	if b.err == nil {
		timedOut := false
		timer := time.AfterFunc(closeFlushTimeout, func() {
			b.mu.Lock()
			timedOut = true
			b.cond.Broadcast()
			b.mu.Unlock()
		})
		for b.err == nil && !timedOut && (len(b.buf) > 0 || b.writing) {
			b.cond.Wait()
		}
		timer.Stop()
		if b.err == nil {
			b.err = net.ErrClosed
		}
		b.cond.Broadcast()
	}
	b.mu.Unlock()
	return b.Conn.Close()
}
