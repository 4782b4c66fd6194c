package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/harvest-run/harvest/pkg/api"
)

// startFields maps each JSON field of a start request to its Go type, so a
// body that fails the strict decode can be examined field by field.
var startFields = jsonFields(reflect.TypeFor[api.StartRequest]())

func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		out[name] = f.Type
	}
	return out
}

// decodeStart reads one start request strictly: one JSON object, known
// fields only, each of the right type. The error names the field at fault.
func decodeStart(data []byte) (api.StartRequest, *api.Error) {
	if !utf8.Valid(data) {
		// The decoder would put U+FFFD in place of the bad bytes and the
		// start would be taken with a name nobody sent.
		return api.StartRequest{}, notUTF8(data)
	}
	var req api.StartRequest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			return api.StartRequest{}, api.NewError(api.CodeInvalidArgument, "the body must hold one JSON object and nothing after it")
		}
		return req, nil
	}
	return api.StartRequest{}, diagnose(data, startFields, err)
}

// notUTF8 names the first field (in key order) whose value holds bytes
// that are not UTF-8. (Bad bytes in a field's name are reported for the
// whole body: the name could not be printed as received.)
func notUTF8(data []byte) *api.Error {
	var obj map[string]json.RawMessage
	if json.Unmarshal(data, &obj) == nil {
		keys := make([]string, 0, len(obj))
		for k, v := range obj {
			if !utf8.Valid(v) {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		if len(keys) > 0 {
			return api.Invalid(keys[0], "%s holds bytes that are not UTF-8; send text as UTF-8", keys[0])
		}
	}
	return api.NewError(api.CodeInvalidArgument, "the body holds bytes that are not UTF-8; send JSON as UTF-8")
}

// diagnose explains why a body did not decode into a struct whose fields
// are given, naming the first field at fault in the order of the body's
// keys sorted by name (so the answer does not depend on map order).
func diagnose(data []byte, fields map[string]reflect.Type, err error) *api.Error {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return api.NewError(api.CodeInvalidArgument, "the body is empty; send a JSON object")
	}
	if !json.Valid(trimmed) {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return api.NewError(api.CodeInvalidArgument, "the body is not valid JSON: %v (at byte %d)", se, se.Offset)
		}
		return api.NewError(api.CodeInvalidArgument, "the body is not valid JSON")
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(trimmed, &obj) != nil || obj == nil {
		return api.NewError(api.CodeInvalidArgument, "the body must be a JSON object")
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, ok := fields[k]; !ok {
			return api.Invalid(k, "unknown field %q", k)
		}
	}
	for _, k := range keys {
		v := reflect.New(fields[k])
		if ferr := json.Unmarshal(obj[k], v.Interface()); ferr != nil {
			var te *json.UnmarshalTypeError
			if errors.As(ferr, &te) {
				return api.Invalid(k, "%s must be %s, got %s", k, jsonKind(fields[k]), te.Value)
			}
			return api.Invalid(k, "%s: %v", k, ferr)
		}
	}
	return api.NewError(api.CodeInvalidArgument, "the body cannot be read: %v", err)
}

// jsonKind names the JSON type a Go type is read from, for messages.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a JSON value"
		}
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "a " + t.Kind().String()
}

// decodeBatch reads a batch start: {"runs": [...]}. A body that is not
// such an object fails as a whole; each item is decoded on its own, so a
// bad item gets its own error and does not sink the others.
func decodeBatch(data []byte) ([]api.StartRequest, []*api.Error, *api.Error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, nil, api.NewError(api.CodeInvalidArgument, "the body is empty; send {\"runs\": [...]}")
	}
	if !json.Valid(trimmed) {
		return nil, nil, api.NewError(api.CodeInvalidArgument, "the body is not valid JSON")
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(trimmed, &obj) != nil || obj == nil {
		return nil, nil, api.NewError(api.CodeInvalidArgument, "the body must be a JSON object: {\"runs\": [...]}")
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != "runs" {
			return nil, nil, api.Invalid(k, "unknown field %q", k)
		}
	}
	raw, ok := obj["runs"]
	if !ok {
		return nil, nil, api.Invalid("runs", "runs is required: a list of start requests")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		return nil, nil, api.Invalid("runs", "runs must be an array of start requests")
	}
	if len(items) > api.MaxBatchItems {
		return nil, nil, api.Invalid("runs", "runs holds %d items; the limit is %d", len(items), api.MaxBatchItems)
	}
	reqs := make([]api.StartRequest, len(items))
	errs := make([]*api.Error, len(items))
	for i, item := range items {
		reqs[i], errs[i] = decodeStart(item)
	}
	return reqs, errs, nil
}
