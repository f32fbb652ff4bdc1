// Package handlers adapts typed functions to Watermill handlers, so that service code works
// with structs instead of raw payloads.
package handlers

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
)

// ContentType is set on the messages NewJSON makes, as their AMQP content-type property
// (warren.MetadataContentType).
const ContentType = "application/json"

// JSON adapts fn to a message.NoPublishHandlerFunc: the payload is decoded into a T and fn
// gets the message's context (with its trace and delivery) and the value. A payload that
// cannot be decoded is a permanent error: the message goes to the poison queue at once,
// without retries.
func JSON[T any](fn func(ctx context.Context, v T) error) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		v, err := Decode[T](msg)
		if err != nil {
			return err
		}
		return fn(msg.Context(), v)
	}
}

// JSONWithOutput is JSON for handlers that return messages to publish (see NewJSON).
func JSONWithOutput[T any](fn func(ctx context.Context, v T) ([]*message.Message, error)) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		v, err := Decode[T](msg)
		if err != nil {
			return nil, err
		}
		return fn(msg.Context(), v)
	}
}

// Decode decodes msg's JSON payload into a T; failure is a permanent error.
func Decode[T any](msg *message.Message) (T, error) {
	var v T
	if err := json.Unmarshal(msg.Payload, &v); err != nil {
		return v, warren.Permanent(fmt.Errorf("decode message %s as %T: %w", msg.UUID, v, err))
	}
	return v, nil
}

// NewJSON makes a message with v encoded as JSON, a new UUID and ctx as its context, so
// that publishing it continues ctx's trace.
func NewJSON(ctx context.Context, v any) (*message.Message, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", v, err)
	}
	msg := message.NewMessage(watermill.NewUUID(), b)
	msg.Metadata.Set(warren.MetadataContentType, ContentType)
	msg.SetContext(ctx)
	return msg, nil
}
