package amqpx

import (
	"net"
	"sync"
)

// inProcess holds the brokers of this process by the host their URLs name (see
// RegisterBroker).
var inProcess sync.Map // host → func() (net.Conn, error)

// RegisterBroker makes the connections to URLs whose host is host dial dial instead of the
// network: an in-memory broker of the tests (package memrabbit), reached by every component
// as it reaches RabbitMQ. It returns the function that removes it.
func RegisterBroker(host string, dial func() (net.Conn, error)) (unregister func()) {
	inProcess.Store(host, dial)
	return func() { inProcess.Delete(host) }
}

// inProcessDial returns the dial function of the broker registered for address's host, if
// there is one.
func inProcessDial(address string) (func() (net.Conn, error), bool) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	d, ok := inProcess.Load(host)
	if !ok {
		return nil, false
	}
	return d.(func() (net.Conn, error)), true
}
