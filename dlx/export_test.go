package dlx

// ConnectionClosed reports whether the publisher has no open connection: none was dialled
// yet, or the client has seen its connection closed. A test that drops the connection
// waits on it before the next call, which must then dial.
func (p *Publisher) ConnectionClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn == nil || p.conn.IsClosed()
}
