package ledger

import (
	"encoding/base64"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/warrenmq/warren/internal/msjson"
)

// Ops of the records.
const (
	opScheduled = "scheduled"
	opCancelled = "cancelled"
	opDelivered = "delivered"
	opMark      = "mark" // appended by List, to know where the stream's end was
)

// record is one entry of the stream. Its id is IDBase64 when set, else ID (see exactID).
type record struct {
	Op       string    `json:"op"`
	ID       string    `json:"id,omitempty"`
	IDBase64 string    `json:"id_base64,omitempty"`
	Token    string    `json:"token,omitempty"`
	Entry    *Entry    `json:"entry,omitempty"`
	At       time.Time `json:"at"`
}

// newRecord is a record of op for id, appended now.
func newRecord(op, id string) record {
	return record{Op: op, ID: id, IDBase64: idBase64(id), At: time.Now().UTC()}
}

// ScheduledRecord is the body of the "scheduled" record of e, which the DLX publisher
// appends to the ledger before it publishes the message.
func ScheduledRecord(e Entry) []byte {
	body, _ := msjson.Marshal(record{Op: opScheduled, ID: e.ID, IDBase64: idBase64(e.ID), Entry: &e, At: e.Scheduled})
	return body
}

// An id is any string of bytes a message carries (warren.MetadataScheduleID is a header, an
// AMQP long string). JSON strings hold valid UTF-8 only: encoding/json writes each byte that
// is not UTF-8 as U+FFFD, so "a\xff" and "a\xfe" would both be read back as "a\ufffd". A
// record and an Entry therefore carry, beside the id as JSON writes it, the id's exact bytes
// in base64 (id_base64) whenever JSON would not keep it: when it is not valid UTF-8, or holds
// U+FFFD itself. A reader takes id_base64 when present, else id, which is then exact. Records
// written without id_base64 by earlier versions are read as written (see legacy).

// idBase64 is id in standard base64 when JSON cannot hold it exactly (see above), else "".
func idBase64(id string) string {
	if utf8.ValidString(id) && !strings.ContainsRune(id, utf8.RuneError) {
		return ""
	}
	return base64.StdEncoding.EncodeToString([]byte(id))
}

// exactID returns the id of r, and false when its id_base64 is not base64 (a record warren
// did not write: skipped).
func (r record) exactID() (string, bool) {
	if r.IDBase64 == "" {
		return r.ID, true
	}
	b, err := base64.StdEncoding.DecodeString(r.IDBase64)
	return string(b), err == nil
}

// legacy reports whether a record of id, read without id_base64, may have lost bytes: an
// earlier version wrote each byte of an id that is not UTF-8 as U+FFFD, with no exact copy.
// Since id_base64 is written for every id holding U+FFFD, a record without it whose id holds
// U+FFFD was written so (or forged).
func legacy(r record) bool {
	return r.IDBase64 == "" && strings.ContainsRune(r.ID, utf8.RuneError)
}

// lossy is id as encoding/json writes it: each byte that is not UTF-8 becomes U+FFFD.
func lossy(id string) string {
	var b strings.Builder
	for _, r := range id { // a byte that is not UTF-8 ranges as one utf8.RuneError
		b.WriteRune(r)
	}
	return b.String()
}
