// Package jsonschema validates JSON documents against the subset of JSON Schema (draft 2020-12) that
// oomdbg's documented formats use: type, const, enum, minimum, properties, required, additionalProperties,
// propertyNames, items, anyOf, and $ref to "#/$defs/...". A schema using any other keyword is refused, so a
// schema cannot silently ask for a check this package does not make.
package jsonschema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"reflect"
	"slices"
	"strings"
)

// Schema is a compiled schema.
type Schema struct {
	root map[string]any
}

// known are the keywords a schema may use; annotations are accepted and ignored.
var known = map[string]bool{
	"type": true, "const": true, "enum": true, "minimum": true, "properties": true, "required": true,
	"additionalProperties": true, "propertyNames": true, "items": true, "anyOf": true, "$ref": true, "$defs": true,
	"$schema": false, "$id": false, "title": false, "description": false,
}

// Compile parses a schema and checks that it uses only the supported keywords and that its references
// resolve.
func Compile(data []byte) (*Schema, error) {
	v, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	root, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("schema: not an object")
	}
	s := &Schema{root: root}
	if err := s.check(root, "#"); err != nil {
		return nil, err
	}
	return s, nil
}

// check walks a schema, refusing unknown keywords and dangling references.
func (s *Schema) check(node map[string]any, at string) error {
	for k, v := range node {
		if _, ok := known[k]; !ok {
			return fmt.Errorf("schema %s: unsupported keyword %q", at, k)
		}
		switch k {
		case "properties", "$defs":
			m, ok := v.(map[string]any)
			if !ok {
				return fmt.Errorf("schema %s/%s: not an object", at, k)
			}
			for name, sub := range m {
				if err := s.checkSub(sub, at+"/"+k+"/"+name); err != nil {
					return err
				}
			}
		case "items", "propertyNames":
			if err := s.checkSub(v, at+"/"+k); err != nil {
				return err
			}
		case "additionalProperties":
			if _, ok := v.(bool); !ok {
				if err := s.checkSub(v, at+"/"+k); err != nil {
					return err
				}
			}
		case "anyOf":
			list, ok := v.([]any)
			if !ok || len(list) == 0 {
				return fmt.Errorf("schema %s/anyOf: not a non-empty array", at)
			}
			for i, sub := range list {
				if err := s.checkSub(sub, fmt.Sprintf("%s/anyOf/%d", at, i)); err != nil {
					return err
				}
			}
		case "$ref":
			ref, _ := v.(string)
			if _, err := s.resolve(ref); err != nil {
				return fmt.Errorf("schema %s: %w", at, err)
			}
		}
	}
	return nil
}

func (s *Schema) checkSub(v any, at string) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("schema %s: not an object", at)
	}
	return s.check(m, at)
}

func (s *Schema) resolve(ref string) (map[string]any, error) {
	name, ok := strings.CutPrefix(ref, "#/$defs/")
	if !ok {
		return nil, fmt.Errorf("unsupported reference %q (want #/$defs/...)", ref)
	}
	defs, _ := s.root["$defs"].(map[string]any)
	def, ok := defs[name].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("reference %q does not resolve", ref)
	}
	return def, nil
}

// Validate checks a JSON document and returns every violation, each naming where it is (a JSON pointer)
// and what is wrong; nil when the document is valid.
func (s *Schema) Validate(doc []byte) []error {
	v, err := decode(doc)
	if err != nil {
		return []error{err}
	}
	var errs []error
	s.validate(s.root, v, "", &errs)
	return errs
}

// ValidateRef checks a JSON document against a definition of the schema, ref being "#/$defs/name".
func (s *Schema) ValidateRef(ref string, doc []byte) []error {
	def, err := s.resolve(ref)
	if err != nil {
		return []error{err}
	}
	v, err := decode(doc)
	if err != nil {
		return []error{err}
	}
	var errs []error
	s.validate(def, v, "", &errs)
	return errs
}

func decode(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("data after the JSON value")
	}
	return v, nil
}

func (s *Schema) validate(schema map[string]any, v any, at string, errs *[]error) {
	fail := func(format string, args ...any) {
		where := at
		if where == "" {
			where = "/"
		}
		*errs = append(*errs, fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...)))
	}
	if ref, ok := schema["$ref"].(string); ok {
		def, err := s.resolve(ref)
		if err != nil {
			fail("%v", err)
			return
		}
		s.validate(def, v, at, errs)
	}
	if t, ok := schema["type"]; ok && !typeMatches(t, v) {
		fail("%s is not of type %v", kind(v), t)
		return
	}
	if c, ok := schema["const"]; ok && !equal(c, v) {
		fail("%v is not %v", v, c)
	}
	if e, ok := schema["enum"].([]any); ok && !slices.ContainsFunc(e, func(x any) bool { return equal(x, v) }) {
		fail("%v is not one of %v", v, e)
	}
	if m, ok := schema["minimum"].(json.Number); ok {
		if n, isNum := v.(json.Number); isNum && compare(n, m) < 0 {
			fail("%v is below the minimum %v", n, m)
		}
	}
	if list, ok := schema["anyOf"].([]any); ok {
		matched := false
		for _, sub := range list {
			var subErrs []error
			s.validate(sub.(map[string]any), v, at, &subErrs)
			if len(subErrs) == 0 {
				matched = true
				break
			}
		}
		if !matched {
			fail("matches none of the anyOf schemas")
		}
	}
	switch v := v.(type) {
	case map[string]any:
		props, _ := schema["properties"].(map[string]any)
		if req, ok := schema["required"].([]any); ok {
			for _, r := range req {
				if _, present := v[r.(string)]; !present {
					fail("required field %q is missing", r)
				}
			}
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			child := at + "/" + k
			if pn, ok := schema["propertyNames"].(map[string]any); ok {
				s.validate(pn, k, child, errs)
			}
			if sub, ok := props[k].(map[string]any); ok {
				s.validate(sub, v[k], child, errs)
				continue
			}
			switch ap := schema["additionalProperties"].(type) {
			case bool:
				if !ap {
					fail("field %q is not in the schema", k)
				}
			case map[string]any:
				s.validate(ap, v[k], child, errs)
			}
		}
	case []any:
		if items, ok := schema["items"].(map[string]any); ok {
			for i, x := range v {
				s.validate(items, x, fmt.Sprintf("%s/%d", at, i), errs)
			}
		}
	}
}

func typeMatches(t any, v any) bool {
	switch t := t.(type) {
	case string:
		return isType(t, v)
	case []any:
		return slices.ContainsFunc(t, func(x any) bool { s, _ := x.(string); return isType(s, v) })
	}
	return false
}

func isType(t string, v any) bool {
	switch t {
	case "null":
		return v == nil
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		r, ok := new(big.Rat).SetString(n.String())
		return ok && r.IsInt()
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	}
	return false
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	}
	return "a value"
}

// equal compares JSON values, numbers by value.
func equal(a, b any) bool {
	na, oka := a.(json.Number)
	nb, okb := b.(json.Number)
	if oka && okb {
		return compare(na, nb) == 0
	}
	return reflect.DeepEqual(a, b)
}

func compare(a, b json.Number) int {
	ra, oka := new(big.Rat).SetString(a.String())
	rb, okb := new(big.Rat).SetString(b.String())
	if !oka || !okb {
		return strings.Compare(a.String(), b.String())
	}
	return ra.Cmp(rb)
}
