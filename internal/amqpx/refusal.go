package amqpx

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpurl"
)

// refusal says whether a failed connection attempt is worth repeating.
type refusal int

const (
	transient     refusal = iota // another attempt may succeed
	nodeRefused                  // this node refuses for good; another node may not
	brokerRefused                // the broker refuses for good, on every node of the cluster
)

// refusalOf classifies err, the failure of one node's connection attempt (see Dial).
func refusalOf(err error, silentCloseRefuses bool) refusal {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	// crypto/tls wraps its own verification's failure; a Connection.TLS verifier of its own
	// (VerifyPeerCertificate, VerifyConnection) may return x509's errors unwrapped.
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		return nodeRefused
	}
	var ae *amqp.Error
	switch {
	case !errors.As(err, &ae):
		return transient
	case ae == amqp.ErrCredentials:
		if silentCloseRefuses {
			return brokerRefused
		}
		return transient
	case ae == amqp.ErrSASL: // the mechanisms the broker offered (connection.start)
		return brokerRefused
	case !ae.Server: // amqp091-go's guess (amqp.ErrVhost): the socket closed during the handshake
		return transient
	case ae.Code == amqp.AccessRefused:
		return brokerRefused
	case ae.Code == amqp.NotAllowed:
		// RabbitMQ's 530s on connection.open: "vhost v not found", "access to vhost 'v'
		// refused for user 'u'" (permanent); a connection limit reached, or an auth
		// backend that "returned an error" (transient).
		if strings.Contains(ae.Reason, "limit") || strings.Contains(ae.Reason, "returned an error") {
			return transient
		}
		return brokerRefused
	}
	return transient
}

// named returns err, the failure of dialling url, with url in front (without its password),
// and saying so when it is a refusal.
func named(url string, err error, r refusal) error {
	if r != transient {
		return fmt.Errorf("%s: %w (refused: not retried)", amqpurl.Redact(url), err)
	}
	return fmt.Errorf("%s: %w", amqpurl.Redact(url), err)
}

// giveUpIf returns err, marked by GiveUp when r is a refusal.
func giveUpIf(r refusal, err error) error {
	if r == transient {
		return err
	}
	return GiveUp(err)
}

// GiveUpIfRefused marks err by GiveUp when it is a broker refusal that retrying cannot
// change (see IsPermanentBrokerError), and returns it unchanged otherwise.
func GiveUpIfRefused(err error) error {
	if IsPermanentBrokerError(err) {
		return GiveUp(err)
	}
	return err
}

// IsPermanentBrokerError reports whether err is a broker reply that retrying cannot change
// (access refused, precondition failed, not found, ...), as opposed to a lost connection.
// A durable queue reported absent ("home node ... is down or inaccessible") is not
// permanent: in a cluster its node may come back, and on a single node RabbitMQ (3.x)
// gives that reply for a moment while another connection declares or deletes the same
// queue (it reads its two queue tables outside a transaction; docs/decisions.md).
func IsPermanentBrokerError(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	if ae.Code == amqp.NotFound && strings.Contains(ae.Reason, "is down or inaccessible") {
		return false
	}
	switch ae.Code {
	case amqp.AccessRefused, amqp.PreconditionFailed, amqp.NotFound, amqp.ResourceLocked,
		amqp.NotAllowed, amqp.NotImplemented, amqp.SyntaxError, amqp.CommandInvalid, amqp.InvalidPath:
		return true
	}
	return false
}

// IsNotFound reports whether err is the broker's answer that a queue or exchange does not
// exist (404 NOT_FOUND), and not the one about a durable queue whose node is down (see
// IsPermanentBrokerError).
func IsNotFound(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.NotFound && IsPermanentBrokerError(err)
}
