package rpc

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren/handlers"
)

// Handler adapts fn to a server handler (register it with router.HandlerConfig.Reply set):
// the request's JSON body is decoded into a Req (a body that cannot be decoded is a
// permanent error: the request is poisoned at once and the caller gets an error reply), fn
// gets the request's context (with its trace and delivery) and the value, and what fn returns
// is the reply, encoded as JSON with content type application/json. An error of fn fails the
// request like any handler's: retried on its schedule, then poisoned and answered with an
// error reply.
func Handler[Req, Resp any](fn func(ctx context.Context, req Req) (Resp, error)) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		req, err := handlers.Decode[Req](msg)
		if err != nil {
			return nil, err
		}
		resp, err := fn(msg.Context(), req)
		if err != nil {
			return nil, err
		}
		reply, err := handlers.NewJSON(msg.Context(), resp)
		if err != nil {
			return nil, err
		}
		return []*message.Message{reply}, nil
	}
}

// Call sends req, encoded as JSON, to topic's destination with c, and decodes the reply's
// JSON body into a Resp. It fails like Client.Call, and when the reply cannot be decoded.
func Call[Req, Resp any](ctx context.Context, c *Client, topic string, req Req) (Resp, error) {
	var resp Resp
	msg, err := handlers.NewJSON(ctx, req)
	if err != nil {
		return resp, err
	}
	reply, err := c.Call(ctx, topic, msg)
	if err != nil {
		return resp, err
	}
	if err := json.Unmarshal(reply.Payload, &resp); err != nil {
		return resp, fmt.Errorf("rpc: call %q: decode the reply as %T: %w", topic, resp, err)
	}
	return resp, nil
}

// Send sends req, encoded as JSON, to topic's destination with c, without waiting for a
// reply (see Client.Send).
func Send[Req any](ctx context.Context, c *Client, topic string, req Req) error {
	msg, err := handlers.NewJSON(ctx, req)
	if err != nil {
		return err
	}
	return c.Send(ctx, topic, msg)
}
