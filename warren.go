// Package warren holds what every part of warren shares: the Connection to the broker (a
// cluster's nodes, TLS, amqp091-go's settings, connection events), the Marshaler between
// Watermill messages and AMQP, and the names of the headers warren reads and writes.
//
// The parts themselves live in their own packages: topology declares exchanges, queues,
// bindings and the delay levels; dlx publishes, with or without a delay; router and
// middleware run handlers with retries, a poison queue and tracing.
package warren
