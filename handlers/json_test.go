package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/handlers"
)

type order struct {
	ID    string `json:"id"`
	Total int    `json:"total"`
}

func TestJSONDecodesIntoTheStruct(t *testing.T) {
	var got order
	h := handlers.JSON(func(ctx context.Context, o order) error {
		got = o
		return nil
	})
	require.NoError(t, h(message.NewMessage("1", []byte(`{"id":"o-1","total":42}`))))
	assert.Equal(t, order{ID: "o-1", Total: 42}, got)
}

func TestUndecodablePayloadIsPermanent(t *testing.T) {
	called := false
	h := handlers.JSON(func(ctx context.Context, o order) error { called = true; return nil })
	err := h(message.NewMessage("1", []byte(`{"id":`)))
	require.Error(t, err)
	assert.True(t, warren.IsPermanent(err))
	assert.Contains(t, err.Error(), "handlers_test.order")
	assert.False(t, called)

	err = h(message.NewMessage("2", []byte(`{"total":"many"}`)))
	assert.True(t, warren.IsPermanent(err), "wrong type: %v", err)
}

func TestHandlerErrorsAreNotMadePermanent(t *testing.T) {
	boom := errors.New("database down")
	h := handlers.JSON(func(ctx context.Context, o order) error { return boom })
	err := h(message.NewMessage("1", []byte(`{}`)))
	assert.ErrorIs(t, err, boom)
	assert.False(t, warren.IsPermanent(err))
}

type ctxKey struct{}

func TestJSONWithOutputKeepsTheContext(t *testing.T) {
	h := handlers.JSONWithOutput(func(ctx context.Context, o order) ([]*message.Message, error) {
		out, err := handlers.NewJSON(ctx, order{ID: o.ID + "-shipped"})
		return []*message.Message{out}, err
	})
	in := message.NewMessage("1", []byte(`{"id":"o-1"}`))
	in.SetContext(context.WithValue(context.Background(), ctxKey{}, "trace"))
	out, err := h(in)
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.JSONEq(t, `{"id":"o-1-shipped","total":0}`, string(out[0].Payload))
	assert.Equal(t, "trace", out[0].Context().Value(ctxKey{}))
	assert.Equal(t, handlers.ContentType, out[0].Metadata.Get(warren.MetadataContentType))
}

func ExampleJSON() {
	h := handlers.JSON(func(ctx context.Context, o order) error {
		fmt.Printf("order %s: %d\n", o.ID, o.Total)
		return nil
	})
	_ = h(message.NewMessage("1", []byte(`{"id":"o-7","total":30}`)))
	err := h(message.NewMessage("2", []byte(`not json`)))
	fmt.Println("permanent:", warren.IsPermanent(err))
	// Output:
	// order o-7: 30
	// permanent: true
}
