package trigger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// defaultMaxBytes is the default limit of an HTTP body and of a message:
// room for any valid reason (MaxReasonLen bytes) however a client escapes
// it (a control character takes six bytes in JSON, and encoding/json
// writes <, > and & as six too), with the longest namespace and name.
const defaultMaxBytes = 8 << 10

// decodeObject decodes data, which must be one JSON object and nothing
// after it, into the destinations of members (by member name, pointers as
// for json.Unmarshal). It is stricter than encoding/json alone: a member's
// name must match exactly (encoding/json would take "Reason" or "REASON"
// for "reason"), a member may appear only once (encoding/json keeps the
// last), and, unless allowUnknown, a member not listed is an error. The
// errors name the member and say what was expected; they do not wrap
// ErrInvalid (callers do).
func decodeObject(data []byte, members map[string]any, allowUnknown bool) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	switch tok, err := dec.Token(); {
	case err == io.EOF:
		return errors.New("empty: want a JSON object")
	case err != nil:
		return unended(err)
	case tok != json.Delim('{'):
		return errors.New("not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return unended(err)
		}
		name := tok.(string) // inside an object, the decoder returns names as strings
		dst, known := members[name]
		switch {
		case known && seen[name]:
			return fmt.Errorf("member %q given twice", name)
		case !known && !allowUnknown:
			return fmt.Errorf("unknown member %q (known: %s)", name, strings.Join(slices.Sorted(maps.Keys(members)), ", "))
		case !known:
			dst = new(json.RawMessage) // an unknown member's value, skipped
		}
		seen[name] = true
		if err := dec.Decode(dst); err != nil {
			if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
				return fmt.Errorf("member %q: want a JSON %s, got %s", name, te.Type, te.Value)
			}
			return fmt.Errorf("member %q: %w", name, unended(err))
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return unended(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON object")
	}
	return nil
}

// unended names a JSON text cut short, which encoding/json reports as a
// bare EOF.
func unended(err error) error {
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("the JSON object does not end: %w", io.ErrUnexpectedEOF)
	}
	return err
}
