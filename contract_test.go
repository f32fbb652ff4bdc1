package warren_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
)

// Every header and metadata key is declared in the root package, or in internal/contract
// (the transport headers): no other package's code spells one (or a name under one of the
// contract's prefixes) as a string literal. Tests may.
func TestNoOtherPackageDeclaresAKey(t *testing.T) {
	keys := map[string]bool{}
	for _, k := range []string{
		warren.MetadataContentType, warren.MetadataContentEncoding, warren.MetadataCorrelationID, warren.MetadataReplyTo,
		warren.MetadataType, warren.MetadataAppID, warren.MetadataUserID, warren.MetadataTimestamp, warren.MetadataPriority,
		warren.MetadataExpiration, warren.MetadataRedelivered, warren.MetadataDelay, warren.MetadataDeliverAt,
		warren.MetadataPublishID, contract.PublishIDHeader, contract.DestExchangeHeader, contract.DestQueueHeader, contract.DueHeader,
		contract.UnreadableHeader, warren.XDeathHeader, warren.XLastDeathReasonHeader, warren.XDeliveryCountHeader,
		warren.AttemptKey, warren.FirstFailureKey, warren.OriginalExchangeKey, warren.OriginalRoutingKeyKey, warren.RetryQueueKey,
		warren.ReplaysKey, warren.RPCErrorKey,
	} {
		keys[k] = true
	}
	prefixes := []string{warren.PoisonHeaderPrefix, contract.TransportHeaderPrefix, "_watermill_", "x-death", "x-first-death-", "x-last-death-"}
	fset := token.NewFileSet()
	var checked int
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		// internal/memrabbit is the broker's side: it writes RabbitMQ's own headers (x-death,
		// x-first-death-*, ...) as RabbitMQ does, under RabbitMQ's names.
		if dir := filepath.Dir(path); dir == "." || dir == filepath.Join("internal", "contract") || dir == filepath.Join("internal", "memrabbit") ||
			!strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			if keys[s] {
				t.Errorf("%s: %q is a key of the root package's contract: use its name", fset.Position(lit.Pos()), s)
			}
			for _, p := range prefixes {
				if strings.HasPrefix(s, p) {
					t.Errorf("%s: %q starts with %q, a prefix of the root package's contract", fset.Position(lit.Pos()), s, p)
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	assert.Greater(t, checked, 50, "the packages were found")
}
