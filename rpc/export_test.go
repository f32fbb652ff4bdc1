package rpc

// InFlight returns how many calls and sends are in flight (registered by correlation id).
func (c *Client) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// Sent reports whether the broker confirmed the request of the call in flight with
// correlation id id.
func (c *Client) Sent(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.pending[id]
	return k != nil && k.sent.Load()
}
