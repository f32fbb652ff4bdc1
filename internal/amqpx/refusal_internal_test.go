package amqpx

import (
	"crypto/x509"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
)

// RabbitMQ's refusals of connection.open (rabbit_reader, rabbit_access_control) and
// amqp091-go's guesses are told apart: what retrying cannot change, from a limit reached or a
// handshake cut short.
func TestRefusalOf(t *testing.T) {
	broker := func(code int, reason string) error { return &amqp.Error{Code: code, Reason: reason, Server: true} }
	for _, tc := range []struct {
		err  error
		want refusal
	}{
		{broker(amqp.NotAllowed, "NOT_ALLOWED - vhost v not found"), brokerRefused},
		{broker(amqp.NotAllowed, "NOT_ALLOWED - access to vhost 'v' refused for user 'u'"), brokerRefused},
		{broker(amqp.NotAllowed, "NOT_ALLOWED - access to vhost 'v' refused for user 'u': connection limit (5) is reached"), transient},
		{broker(amqp.NotAllowed, "NOT_ALLOWED - connection refused for user 'u': user connection limit (5) is reached"), transient},
		{broker(amqp.NotAllowed, "NOT_ALLOWED - connection refused: node connection limit (100) is reached"), transient},
		{broker(amqp.NotAllowed, "NOT_ALLOWED - access to vhost 'v' refused for user 'u', backend rabbit_auth_backend_http returned an error: timeout"), transient},
		{broker(amqp.AccessRefused, "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN"), brokerRefused},
		{broker(amqp.InternalError, "INTERNAL_ERROR - access to vhost 'v' refused for user 'u': vhost 'v' is down"), transient},
		{broker(amqp.ConnectionForced, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"), transient},
		{amqp.ErrSASL, brokerRefused},
		{amqp.ErrVhost, transient}, // closed without a reply to connection.open: RabbitMQ always replies
		{&amqp.Error{Code: amqp.FrameError, Reason: "EOF"}, transient},
		{fmt.Errorf("TLS handshake with h:1: %w", x509.UnknownAuthorityError{}), nodeRefused},
		{x509.HostnameError{Certificate: &x509.Certificate{}, Host: "h"}, nodeRefused},
		{x509.CertificateInvalidError{Reason: x509.Expired}, nodeRefused},
		{fmt.Errorf("dial tcp 127.0.0.1:1: connect: connection refused"), transient},
	} {
		assert.Equal(t, tc.want, refusalOf(tc.err, true), "%v", tc.err)
	}
	assert.Equal(t, brokerRefused, refusalOf(amqp.ErrCredentials, true))
	assert.Equal(t, transient, refusalOf(amqp.ErrCredentials, false))
}
