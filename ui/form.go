package ui

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"
)

// A value that a page writes into a form goes back to the server as the browser read it, not
// as it was: a browser decodes the page as UTF-8 (a byte that is not UTF-8 becomes U+FFFD),
// html/template writes NUL as U+FFFD, and a form normalises line breaks. An id or a queue
// name read from the broker may hold any of these (AMQP carries bytes), so a form field
// whose value would not come back as it is carries base64url of the value's bytes instead,
// under the field's name with exactSuffix; the server reads either (see form). A link needs
// none of this: html/template percent-encodes its query, byte for byte.
const exactSuffix = ".b64"

// plain reports whether s comes back from a form field as it was written: valid UTF-8
// without control characters (C0, DEL, C1).
func plain(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r >= 0x7f && r <= 0x9f })
}

// fieldName is the name of the form field that carries value as the field name: name
// itself if value is plain, else name with exactSuffix.
func fieldName(name, value string) string {
	if plain(value) {
		return name
	}
	return name + exactSuffix
}

// fieldValue is what the field fieldName names holds: value itself if it is plain, else
// base64url of its bytes.
func fieldValue(value string) string {
	if plain(value) {
		return value
	}
	return base64.RawURLEncoding.EncodeToString([]byte(value))
}

// form returns the fields of r, its query's and its body's, with each NAME.b64 decoded
// into NAME (after NAME's own values); an error names a field that does not decode.
func form(r *http.Request) (url.Values, error) {
	if err := r.ParseForm(); err != nil {
		return url.Values{}, fmt.Errorf("the form does not parse: %w", err)
	}
	v := make(url.Values, len(r.Form))
	for k, vs := range r.Form {
		if !strings.HasSuffix(k, exactSuffix) {
			v[k] = append(v[k], vs...)
		}
	}
	for k, vs := range r.Form {
		name, ok := strings.CutSuffix(k, exactSuffix)
		if !ok {
			continue
		}
		for _, s := range vs {
			b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
			if err != nil {
				return url.Values{}, fmt.Errorf("field %s: not base64url: %w", k, err)
			}
			v[name] = append(v[name], string(b))
		}
	}
	return v, nil
}
