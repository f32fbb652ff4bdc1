package contract_test

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/warrenmq/warren/internal/contract"
)

// The error type is the Go type of the innermost error of the chain.
func TestErrorTypeIsTheInnermost(t *testing.T) {
	assert.Equal(t, "*fs.PathError", contract.ErrorType(fmt.Errorf("load: %w", &fs.PathError{Op: "open", Path: "x"})))
	assert.Equal(t, "*errors.errorString", contract.ErrorType(fmt.Errorf("load: %w", &fs.PathError{Err: errors.New("x")})))
}
