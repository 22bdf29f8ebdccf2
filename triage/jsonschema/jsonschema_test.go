package jsonschema_test

import (
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/triage/jsonschema"
)

const schema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "test",
  "type": "object",
  "additionalProperties": false,
  "required": ["name", "size"],
  "properties": {
    "name": {"type": "string"},
    "size": {"$ref": "#/$defs/bytes"},
    "kind": {"enum": ["a", "b"]},
    "format": {"const": "x/1"},
    "ratio": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "maybe": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/bytes"}]},
    "flag": {"type": ["boolean", "null"]},
    "counts": {"type": "object", "propertyNames": {"enum": ["x", "y"]}, "additionalProperties": {"type": "integer"}}
  },
  "$defs": {"bytes": {"type": "integer", "minimum": 0}}
}`

func TestValidate(t *testing.T) {
	s, err := jsonschema.Compile([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		doc  string
		errs []string // substrings of the errors, in order; none for a valid document
	}{
		"minimal":          {doc: `{"name": "n", "size": 0}`},
		"everything":       {doc: `{"name": "n", "size": 5, "kind": "b", "format": "x/1", "ratio": 0.5, "tags": ["t"], "maybe": null, "flag": true, "counts": {"x": 1}}`},
		"integral float":   {doc: `{"name": "n", "size": 5.0}`},
		"nullable set":     {doc: `{"name": "n", "size": 1, "maybe": 7, "flag": null}`},
		"missing required": {doc: `{"name": "n"}`, errs: []string{`/: required field "size" is missing`}},
		"extra field":      {doc: `{"name": "n", "size": 1, "other": 1}`, errs: []string{`/: field "other" is not in the schema`}},
		"wrong type":       {doc: `{"name": 3, "size": 1}`, errs: []string{`/name: a number is not of type string`}},
		"not an integer":   {doc: `{"name": "n", "size": 1.5}`, errs: []string{`/size: a number is not of type integer`}},
		"below minimum":    {doc: `{"name": "n", "size": -1}`, errs: []string{`/size: -1 is below the minimum 0`}},
		"not in enum":      {doc: `{"name": "n", "size": 1, "kind": "c"}`, errs: []string{`/kind: c is not one of [a b]`}},
		"wrong const":      {doc: `{"name": "n", "size": 1, "format": "x/2"}`, errs: []string{`/format: x/2 is not x/1`}},
		"bad item":         {doc: `{"name": "n", "size": 1, "tags": ["a", 2]}`, errs: []string{`/tags/1: a number is not of type string`}},
		"anyOf fails":      {doc: `{"name": "n", "size": 1, "maybe": -3}`, errs: []string{`/maybe: matches none of the anyOf schemas`}},
		"type list":        {doc: `{"name": "n", "size": 1, "flag": "yes"}`, errs: []string{`/flag: a string is not of type [boolean null]`}},
		"property name":    {doc: `{"name": "n", "size": 1, "counts": {"z": 1}}`, errs: []string{`/counts/z: z is not one of [x y]`}},
		"additional value": {doc: `{"name": "n", "size": 1, "counts": {"x": "1"}}`, errs: []string{`/counts/x: a string is not of type integer`}},
		"not an object":    {doc: `[]`, errs: []string{`/: an array is not of type object`}},
		"not JSON":         {doc: `{"name": `, errs: []string{"unexpected EOF"}},
		"two values":       {doc: `{"name": "n", "size": 1} {}`, errs: []string{"data after the JSON value"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			errs := s.Validate([]byte(tc.doc))
			if len(errs) != len(tc.errs) {
				t.Fatalf("errors %v, want %d", errs, len(tc.errs))
			}
			for i, err := range errs {
				if !strings.Contains(err.Error(), tc.errs[i]) {
					t.Errorf("error %q, want %q", err, tc.errs[i])
				}
			}
		})
	}
}

func TestCompileRefuses(t *testing.T) {
	tests := map[string]struct{ schema, err string }{
		"unsupported keyword": {`{"type": "object", "pattern": "x"}`, `unsupported keyword "pattern"`},
		"nested unsupported":  {`{"properties": {"a": {"maxLength": 3}}}`, `schema #/properties/a: unsupported keyword "maxLength"`},
		"dangling reference":  {`{"$ref": "#/$defs/nothing"}`, `reference "#/$defs/nothing" does not resolve`},
		"foreign reference":   {`{"$ref": "other.json"}`, `unsupported reference "other.json"`},
		"not an object":       {`[1]`, "not an object"},
		"bad anyOf":           {`{"anyOf": []}`, "not a non-empty array"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := jsonschema.Compile([]byte(tc.schema))
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Compile = %v, want an error with %q", err, tc.err)
			}
		})
	}
}

func TestValidateRef(t *testing.T) {
	s, err := jsonschema.Compile([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	if errs := s.ValidateRef("#/$defs/bytes", []byte("12")); len(errs) != 0 {
		t.Errorf("12 is bytes: %v", errs)
	}
	if errs := s.ValidateRef("#/$defs/bytes", []byte("-1")); len(errs) != 1 {
		t.Errorf("-1 is not bytes: %v", errs)
	}
	if errs := s.ValidateRef("#/$defs/none", []byte("1")); len(errs) != 1 {
		t.Errorf("an unknown definition: %v", errs)
	}
}
