package ui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
)

// csrfCookie holds a browser's random nonce; a form's token is the nonce signed with the
// Handler's key (a signed double-submit cookie). A page from another site can neither read
// the cookie nor sign a nonce of its own, so it cannot make a token the action accepts.
const (
	csrfCookie = "warren_csrf"
	csrfField  = "csrf"
)

// token returns the CSRF token of r's browser, setting its nonce cookie first if it has none.
func (h *Handler) token(w http.ResponseWriter, r *http.Request) string {
	nonce := ""
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) >= 16 {
		nonce = c.Value
	} else {
		b := make([]byte, 18)
		_, _ = rand.Read(b)
		nonce = base64.RawURLEncoding.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: nonce, Path: h.cfg.Prefix + "/", HttpOnly: true,
			Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	}
	return h.sign(nonce)
}

func (h *Handler) sign(nonce string) string {
	m := hmac.New(sha256.New, h.csrfKey)
	m.Write([]byte(nonce))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// validToken reports whether r's form carries the token of its nonce cookie.
func (h *Handler) validToken(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil || len(c.Value) < 16 {
		return false
	}
	return hmac.Equal([]byte(r.PostFormValue(csrfField)), []byte(h.sign(c.Value)))
}
