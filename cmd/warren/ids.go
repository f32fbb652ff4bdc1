package main

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A message id, or a schedule id, is any string of bytes: NUL and bytes that are not UTF-8
// included, which no shell argument can hold (NUL) or which a terminal cannot show. The CLI
// prints an id, and reads one from an argument, in one of two forms that cannot be taken for
// each other:
//
//   - as it is, when it is one word of printable characters: no space, no quote (" or '), no
//     backslash, no U+FFFD, nothing a terminal would hide or act on;
//   - else as a Go string literal in double quotes ("tick\x00", "order-7\xff", "ctl\u009b",
//     "\ufffd"), each byte that is not printable UTF-8 escaped as internal/visible escapes
//     it, and ' written \x27, so that the form pasted between single quotes is one shell
//     argument.
//
// An argument that starts with a double quote is read as the quoted form; any other is the
// id as it is. An id that itself starts with a double quote is therefore always given quoted
// (as the CLI prints it).

// showID returns id as the CLI prints it (see above).
func showID(id string) string {
	if plainID(id) {
		return id
	}
	return quoteID(id)
}

// quoteID writes id as a Go string literal that strconv.Unquote reads back, escaping as
// internal/visible does wherever it escapes (\x00, \x1b, \xff for a byte that is not UTF-8,
// \u007f, \u009b), and also ", \, ' (\x27), newline (\n), tab (\t), U+FFFD (\ufffd) and
// every other character that is not printable.
func quoteID(id string) string {
	var b strings.Builder
	b.Grow(len(id) + 8)
	b.WriteByte('"')
	for s := id; s != ""; {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == '\'':
			fmt.Fprintf(&b, `\x%02x`, r)
		case r == utf8.RuneError || !strconv.IsPrint(r): // DEL, C1 and the like; U+FFFD
			if r > 0xffff {
				fmt.Fprintf(&b, `\U%08x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	b.WriteByte('"')
	return b.String()
}

// cutID is showID(id) shortened to n characters ("…" last), for a table: every character
// kept as showID has it (cut would fold the spaces of a quoted form).
func cutID(id string, n int) string {
	s := showID(id)
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// plainID reports whether id is printed as it is.
func plainID(id string) bool {
	if id == "" {
		return false
	}
	for _, r := range id {
		if r == utf8.RuneError || r == ' ' || r == '"' || r == '\'' || r == '\\' || !strconv.IsPrint(r) {
			return false // RuneError: U+FFFD, or a byte that is not UTF-8
		}
	}
	return true
}

// parseID reads an id given as an argument in either form showID prints.
func parseID(arg string) (string, error) {
	if !strings.HasPrefix(arg, `"`) {
		return arg, nil
	}
	id, err := strconv.Unquote(arg)
	if err != nil {
		return "", fmt.Errorf("the id %s starts with a double quote, so it is read as a quoted id (a Go string literal, "+
			`as "warren scheduled list" prints one: "tick\x00"), and it is not one`, arg)
	}
	return id, nil
}

// parseIDs reads each of args with parseID, naming the flag of an argument that is not an id.
func parseIDs(flag string, args []string) ([]string, error) {
	ids := make([]string, 0, len(args))
	for _, a := range args {
		id, err := parseID(a)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// parseBase64ID reads an id given in base64 (standard, as id_base64 in the JSON output).
func parseBase64ID(arg string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(arg)
	if err != nil {
		return "", fmt.Errorf("--base64: the id %q is not standard base64: %w", arg, err)
	}
	return string(b), nil
}
