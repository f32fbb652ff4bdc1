package consumer

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/statequeue"
	"github.com/warrenmq/warren/kill"
)

// replyTimeout bounds a consumer's publish of a kill.Answer.
const replyTimeout = 5 * time.Second

// replyPrefix starts the names the broker gives the queues it names: no client can declare
// one, so an answer sent to one can never land in a work queue.
const replyPrefix = "amq.gen-"

// answer publishes a kill.Answer to the reply address of d, a live command, if it has one,
// saying the subscription is in mode now (or refused it, when refusal is set) and was in
// before when the command came. It never blocks: the publish runs in a goroutine of its own,
// on a channel of its own of the publishing connection (see consumerconns.Conns), without
// confirmation, and a failure is only logged (debug).
func (sub *subscription) answer(d amqp.Delivery, before, now mode, refusal error) {
	if d.ReplyTo == "" { // a command without a reply address, or read from the state
		return
	}
	s := sub.s
	fields := watermill.LogFields{"queue": sub.queue, "handler": s.cfg.HandlerName, "reply_to": d.ReplyTo}
	if !strings.HasPrefix(d.ReplyTo, replyPrefix) {
		s.logger.Debug("Kill command not answered: its reply address is not a server-named queue", fields)
		return
	}
	a := kill.Answer{Queue: sub.queue, State: modeState[now], Consuming: before != paused}
	trusted := len(s.cfg.KillSecret) == 0
	if !trusted {
		var c kill.Command
		err := json.Unmarshal(d.Body, &c)
		if err == nil {
			err = c.VerifyReply(s.cfg.KillSecret, d.ReplyTo, d.CorrelationId)
		}
		trusted = err == nil
		if !trusted && refusal == nil {
			s.logger.Debug("Kill command obeyed but not answered", fields.Add(watermill.LogFields{"err": err.Error()}))
			return
		}
	}
	if trusted { // who answers, only to a sender who may know
		p := self()
		a.Handler, a.Host, a.PID, a.Process, a.Instance = s.cfg.HandlerName, p.host, p.pid, p.id, sub.id
	}
	if refusal != nil {
		a.State, a.Error = refused, refusal.Error()
	}
	if len(s.cfg.KillSecret) > 0 {
		a.Sign(s.cfg.KillSecret, d.CorrelationId)
	}
	body, err := json.Marshal(a)
	if err != nil {
		return
	}
	replyTo, correlationID := d.ReplyTo, d.CorrelationId
	s.answering.Add(1)
	go func() {
		defer s.answering.Done()
		ctx, cancel := context.WithTimeout(context.Background(), replyTimeout)
		defer cancel()
		conn, err := s.conns.Publish.Get(ctx) // a router's publishing connection: see consumerconns.Conns
		if err == nil {
			err = statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
				return ch.PublishWithContext(ctx, "", replyTo, false, false, amqp.Publishing{
					ContentType: "application/json", CorrelationId: correlationID, Body: body, Timestamp: time.Now(),
				})
			})
		}
		if err != nil {
			s.logger.Debug("Kill answer not published", fields.Add(watermill.LogFields{"err": err.Error()}))
		}
	}()
}

// process identifies this process in answers.
type process struct {
	host string
	pid  int
	id   string // random: pids repeat across hosts, containers and restarts
}

var self = sync.OnceValue(func() process {
	host, _ := os.Hostname()
	return process{host: host, pid: os.Getpid(), id: statequeue.NewID()}
})
