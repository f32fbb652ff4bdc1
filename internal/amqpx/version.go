package amqpx

import (
	"strconv"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DeadLetterDoc is the page that explains DeadLetterWarning and how to protect a broker.
const DeadLetterDoc = "https://github.com/warrenmq/warren/blob/main/docs/dead-lettering.md"

// ServerVersion is the RabbitMQ version conn's broker announced when it connected (the
// "version" server property, e.g. "3.10.8"), or "" if it announced none.
func ServerVersion(conn *amqp.Connection) string {
	if conn == nil {
		return ""
	}
	v, _ := conn.Properties["version"].(string)
	return v
}

// DeadLetterWarning returns, for a RabbitMQ server version, the warning that one malformed
// message can stop dead-lettering from quorum queues on the whole node, or "" for a version
// that is not affected (or a version it cannot read).
//
// The rule: RabbitMQ 3.10 (which brought at-least-once dead-lettering from quorum queues)
// up to, not including, 4.0: on those versions a message whose x-death header is malformed,
// published straight into a quorum queue that dead-letters, stops at-least-once
// dead-lettering on the node until that queue is deleted and the node restarted; from 4.0
// the message is parked. Versions that were not checked are warned about (what was measured
// on which version: docs/decisions.md; what to do: docs/dead-lettering.md).
func DeadLetterWarning(version string) string {
	major, minor, ok := majorMinor(version)
	if !ok || major != 3 || minor < 10 {
		return ""
	}
	return "RabbitMQ " + version + ": one message with a malformed x-death header, published straight into a quorum " +
		"queue that dead-letters (warren's delay levels and work queues), stops dead-lettering on the whole node " +
		"until that queue is deleted and the node restarted: delayed messages and retries stop. Upgrade to RabbitMQ 4.0 or later, or let only " +
		"warren's users write to the delay levels: " + DeadLetterDoc
}

// MajorMinor reads the first two numbers of a RabbitMQ version such as "3.10.8",
// "4.0.0-rc.1" or "3.13.7+1.g0abc"; ok is false for a version it cannot read ("" included).
func MajorMinor(version string) (major, minor int, ok bool) { return majorMinor(version) }

// majorMinor reads the first two numbers of a version such as "3.10.8", "4.0.0-rc.1" or
// "3.13.7+1.g0abc".
func majorMinor(version string) (major, minor int, ok bool) {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil || major < 0 || minor < 0 {
		return 0, 0, false
	}
	return major, minor, true
}

// warnedVersions holds the server versions whose DeadLetterWarning this process has logged.
var warnedVersions sync.Map

// warnDeadLetter logs the DeadLetterWarning of conn's server version, once per process and
// version, at Info.
func warnDeadLetter(logger watermill.LoggerAdapter, conn *amqp.Connection, fields watermill.LogFields) {
	v := ServerVersion(conn)
	w := DeadLetterWarning(v)
	if w == "" {
		return
	}
	if _, done := warnedVersions.LoadOrStore(v, true); done {
		return
	}
	logger.Info(w, fields.Add(watermill.LogFields{"server_version": v}))
}

// FileHandleCache reports whether RabbitMQ version counts the file handles of its queues
// against the node's open-file limit (its file_handle_cache): 3.x does, and a node out of
// handles stops answering AMQP handshakes; 4.0 removed the cache. False for a version that
// does not parse.
func FileHandleCache(version string) bool {
	major, _, ok := majorMinor(version)
	return ok && major < 4
}
