package warrentest_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/warrenmq/warren/warrentest"
)

func TestConfigNamesAnUnknownVersion(t *testing.T) {
	assert.NoError(t, warrentest.Config{}.Validate())
	assert.NoError(t, warrentest.Config{Version: "4.0"}.Validate())
	assert.ErrorContains(t, warrentest.Config{Version: "3.8"}.Validate(), "Config.Version")
}
