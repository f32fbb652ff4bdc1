package warren_test

import (
	"crypto/tls"
	"crypto/x509"
	"log"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
)

// A Connection to a three-node cluster over TLS, with a heartbeat and a connection name of
// the application's, that logs when a connection moves to another node. (Not run: it needs
// the cluster.)
func ExampleConnection() {
	roots := x509.NewCertPool()
	if pem, err := os.ReadFile("/etc/billing/rabbitmq-ca.pem"); err == nil {
		roots.AppendCertsFromPEM(pem)
	}
	conn := warren.Connection{
		URL:  "amqps://billing:secret@rmq1:5671/,amqps://billing:secret@rmq2:5671/,amqps://billing:secret@rmq3:5671/",
		TLS:  &tls.Config{RootCAs: roots},
		AMQP: amqp.Config{Heartbeat: 5 * time.Second, Properties: amqp.Table{"connection_name": "billing"}},
		OnEvent: func(e warren.ConnectionEvent) {
			if e.State == warren.FailedOver {
				log.Printf("%s moved from %s to %s", e.Name, e.Previous, e.Node)
			}
		},
	}
	pub, err := dlx.NewPublisher(dlx.Config{Connection: conn}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
}
