package amqpurl_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpurl"
)

func TestSplitURLs(t *testing.T) {
	for raw, want := range map[string][]string{
		"amqp://a/":                           {"amqp://a/"},
		"amqp://a/,amqp://b/":                 {"amqp://a/", "amqp://b/"},
		"amqp://u:p@a:5672/, amqps://u:p@b/v": {"amqp://u:p@a:5672/", "amqps://u:p@b/v"},
		"amqp://u:p,w@a/,AMQP://u:x,y,z@b/":   {"amqp://u:p,w@a/", "AMQP://u:x,y,z@b/"},
		"amqp://u:p,amqp@a/":                  {"amqp://u:p,amqp@a/"},
		"":                                    {""},
	} {
		assert.Equal(t, want, amqpurl.Split(raw), raw)
	}
}

// Every password of a list is redacted, in a URL shown and in an error's text.
func TestRedactURLList(t *testing.T) {
	raw := "amqp://u:s3cr3t@a:5672/,amqp://v:p4ss,w0rd@b:5672/"
	assert.Equal(t, "amqp://u:xxxxx@a:5672/,amqp://v:xxxxx@b:5672/", amqpurl.Redact(raw))
	err := amqpurl.RedactError(raw, errorf("dial amqp://u:s3cr3t@a:5672/ and amqp://v:p4ss,w0rd@b:5672/"))
	for _, secret := range []string{"s3cr3t", "p4ss", "w0rd"} {
		assert.NotContains(t, err.Error(), secret)
	}
	err = amqpurl.Check("amqp://u:s3cr3t@a:5672/,amqp://v:p4ss@b:port/")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "URL 2 of 2")
	assert.NotContains(t, err.Error(), "p4ss")
}

type errorf string

func (e errorf) Error() string { return string(e) }

func TestRedactURL(t *testing.T) {
	for raw, want := range map[string]string{
		"amqp://guest:s3cr3t@host:5672/":  "amqp://guest:xxxxx@host:5672/",
		"amqp://guest:s3@cr3t@host:5672/": "amqp://guest:xxxxx@host:5672/",
		"amqp://guest:s3cr3t@host:bad/":   "amqp://guest:xxxxx@host:bad/",
		"amqp://guest:s3c/r3t@[::1/":      "amqp://guest:xxxxx@[::1/",
		"guest:s3cr3t@host":               "guest:xxxxx@host",
		"amqp://host:5672/":               "amqp://host:5672/",
		"amqp://guest@host:5672/":         "amqp://guest@host:5672/",
		"amqps://u:p@h/v?heartbeat=5":     "amqps://u:xxxxx@h/v?heartbeat=5",
		"":                                "",
	} {
		assert.Equal(t, want, amqpurl.Redact(raw), raw)
	}
}

// Go's url.Error quotes the whole URL; an invalid port can be part of a password.
func TestCheckURLNeverShowsThePassword(t *testing.T) {
	for _, raw := range []string{
		"amqp://guest:s3cr3t-P4ss@host:port/",
		"amqp://guest:s3cr3t-P4ss@host:5672/%zz",
		"amqp://guest:s3cr3t-P4ss@[::1:5672/",
		"amqp://guest:s3cr3t/P4ss@host:5672/",
		"amqp://guest:s3cr3t?P4ss@host:5672/",
		"amqp://guest:s3cr3t#P4ss@host:5672/",
		"amqp://guest:s3cr3t%2FP4ss@host:x/",
		"amqp://guest:s3cr3t\x7fP4ss@host/",
	} {
		err := amqpurl.Check(raw)
		require.Error(t, err, raw)
		for _, part := range []string{"s3cr3t", "P4ss"} {
			assert.NotContains(t, err.Error(), part, raw)
		}
		assert.True(t, strings.Contains(err.Error(), "xxxxx") || !strings.Contains(err.Error(), "guest:"), err.Error())
	}
	require.NoError(t, amqpurl.Check("amqp://guest:s3cr3t-P4ss@host:5672/"))
}
