package amqpx_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
)

// The versions measured (3.10.8 affected, 4.0.5 not) and the rule around them: 3.10 up to
// 4.0, whatever the suffix; nothing for what cannot be read.
func TestDeadLetterWarningByVersion(t *testing.T) {
	for v, affected := range map[string]bool{
		"3.10.8": true, "3.10.0": true, "3.11.28": true, "3.12.14": true, "3.13.7": true,
		"3.13.0-rc.2": true, "3.10.8+1.g0abc": true, "3.10-beta": true,
		"4.0.5": false, "4.0.0-rc.1": false, "4.1.0": false, "4.2.3": false, "5.0.0": false,
		"3.9.29": false, "3.8.35": false, "2.8.7": false,
		"": false, "3": false, "x.y.z": false, "v3.10.8": false, "3.x": false,
	} {
		w := amqpx.DeadLetterWarning(v)
		assert.Equal(t, affected, w != "", "version %q: %q", v, w)
		if affected {
			assert.Contains(t, w, v)
			assert.Contains(t, w, amqpx.DeadLetterDoc)
		}
	}
}

// A Dialer logs the warning of its broker's version on the first connection of the process,
// and not again (another Dialer included); on a broker not affected, never.
func TestDialerWarnsOncePerProcess(t *testing.T) {
	env := testenv.New(t)
	amqpx.ForgetDeadLetterWarnings()
	logger := watermill.NewCaptureLogger()
	for _, name := range []string{"one", "two"} {
		conn, err := amqpx.NewDialer(warren.Connection{URL: env.URL}, name, logger).Dial(t.Context())
		require.NoError(t, err)
		_ = amqpx.Close(conn)
	}
	conn, _, err := amqpx.Dial(t.Context(), warren.Connection{URL: env.URL}, "version")
	require.NoError(t, err)
	version := amqpx.ServerVersion(conn)
	_ = amqpx.Close(conn)
	require.NotEmpty(t, version, "the broker announces its version")
	var warned []string
	for _, m := range logger.Captured()[watermill.InfoLogLevel] {
		if m.Fields["server_version"] != nil {
			warned = append(warned, m.Msg)
			assert.Equal(t, version, m.Fields["server_version"])
		}
	}
	if amqpx.DeadLetterWarning(version) != "" {
		assert.Equal(t, []string{amqpx.DeadLetterWarning(version)}, warned, "RabbitMQ %s: once", version)
	} else {
		assert.Empty(t, warned, "RabbitMQ %s", version)
	}
	t.Logf("RabbitMQ %s: %d warning(s)", version, len(warned))
}
