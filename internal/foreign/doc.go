// Package foreign holds the tests that check what a client of another language sees of
// warren's messages, and warren of its: Node's amqplib (installed by scripts/amqplib.sh)
// publishes with every AMQP basic property and a warren handler reads them as metadata;
// warren publishes metadata and an amqplib consumer reads real properties. It has no code of
// its own.
package foreign
