// Package amqpurl is the grammar of warren's broker addresses: one AMQP URL, or several
// separated by commas, checked, split, and shown without their passwords.
package amqpurl

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// redacted replaces a password.
const redacted = "xxxxx"

// secretSpan returns where the password of raw lies: everything between the first ':'
// after "://" (or after the start, when there is no "://") and the last '@'. ok is false
// when raw has no such span. It does not need raw to parse.
func secretSpan(raw string) (start, end int, ok bool) {
	from := 0
	if i := strings.Index(raw, "://"); i >= 0 {
		from = i + len("://")
	}
	colon := strings.IndexByte(raw[from:], ':')
	at := strings.LastIndexByte(raw, '@')
	if colon < 0 || from+colon >= at {
		return 0, 0, false
	}
	return from + colon + 1, at, true
}

// Split returns the URLs of raw: one AMQP URL, or several separated by commas. A comma
// starts a new URL only where "amqp://" or "amqps://" follows it (spaces between allowed),
// so that a password may hold commas.
func Split(raw string) []string {
	var urls []string
	for _, part := range strings.Split(raw, ",") {
		start := strings.ToLower(strings.TrimSpace(part))
		if len(urls) > 0 && !strings.HasPrefix(start, "amqp://") && !strings.HasPrefix(start, "amqps://") {
			urls[len(urls)-1] += "," + part
			continue
		}
		urls = append(urls, strings.TrimSpace(part))
	}
	return urls
}

// Redact returns raw with every password replaced by "xxxxx", whether or not raw parses:
// "amqp://guest:xxxxx@host:5672/". A URL without a password is returned as it is; a list
// (see Split) is returned as a list, each URL redacted.
func Redact(raw string) string {
	urls := Split(raw)
	for i, u := range urls {
		if start, end, ok := secretSpan(u); ok {
			urls[i] = u[:start] + redacted + u[end:]
		}
	}
	return strings.Join(urls, ",")
}

// Check returns nil if raw is a usable AMQP URL, and otherwise the reason, which never
// contains raw's password. Unlike amqp091's ParseURI, it refuses a URL without "//" after
// the scheme ("amqp:user:pass@host"), which ParseURI takes for the local broker as guest,
// a password whose unescaped '/' made the rest of it a path ("amqp://u:12/x@host", which
// ParseURI takes for host "u", port 12), and a host with two ports ("host:5672:5672").
func Check(raw string) error {
	urls := Split(raw)
	if len(urls) > 1 {
		for i, u := range urls {
			if err := Check(u); err != nil {
				return fmt.Errorf("URL %d of %d: %w", i+1, len(urls), err)
			}
		}
		return nil
	}
	if _, err := amqp.ParseURI(raw); err != nil {
		return RedactError(raw, err)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || !strings.Contains(raw, "://") {
		return errors.New(`URL must start with "amqp://" or "amqps://": ` + Redact(raw))
	}
	if u.User == nil && strings.Contains(raw[strings.Index(raw, "://"):], "@") {
		return fmt.Errorf(`URL %s: the user and password end before the '@' (a '/', '?' or '#' in them must be `+
			`percent-encoded)`, Redact(raw))
	}
	if strings.Contains(u.Hostname(), ":") && !strings.HasPrefix(u.Host, "[") {
		return fmt.Errorf("URL %s: host %q has more than one port", Redact(raw), u.Host)
	}
	return nil
}

// RedactError returns err, which parsing or dialling raw gave, as it is if its text does not
// contain raw's password, and otherwise as an error of the same text with the password
// replaced by "xxxxx" (it then wraps nothing, so that the password cannot be reached
// through it). Go's url.Error quotes the whole URL, and the text of an invalid port can hold
// part of a password that contains '/', '?' or '#': quoted parts of the text that overlap the
// password are replaced too.
func RedactError(raw string, err error) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	for _, u := range Split(raw) {
		if start, end, ok := secretSpan(u); ok {
			text = redactText(text, u[start:end])
		}
	}
	if text == err.Error() {
		return err
	}
	return redactedError(text)
}

type redactedError string

func (e redactedError) Error() string { return string(e) }

var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// redactText replaces secret in text: as it is, as %q shows it, decoded, and any quoted part
// of text that overlaps it.
func redactText(text, secret string) string {
	forms := []string{secret, strings.Trim(strconv.Quote(secret), `"`)}
	if dec, err := url.PathUnescape(secret); err == nil {
		forms = append(forms, dec, strings.Trim(strconv.Quote(dec), `"`))
	}
	for _, f := range forms {
		if f != "" {
			text = strings.ReplaceAll(text, f, redacted)
		}
	}
	return quoted.ReplaceAllStringFunc(text, func(q string) string {
		s, err := strconv.Unquote(q)
		if err != nil {
			s = q[1 : len(q)-1]
		}
		if overlaps(strings.Trim(s, ":/@"), secret) {
			return `"` + redacted + `"`
		}
		return q
	})
}

// overlaps reports whether s (two bytes or more) is a part of secret, or shares three bytes
// in a row with it.
func overlaps(s, secret string) bool {
	if len(s) < 2 {
		return false
	}
	if strings.Contains(secret, s) {
		return true
	}
	for i := 0; i+3 <= len(s); i++ {
		if strings.Contains(secret, s[i:i+3]) {
			return true
		}
	}
	return false
}
