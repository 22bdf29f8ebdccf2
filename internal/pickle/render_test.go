package pickle

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"sort"
	"unicode/utf8"
)

// render turns a decoded value into the tagged form testdata/gen.py writes for Python's own decode (see the
// comment there), numbering lists, dicts and sets in depth-first order of first appearance, so that a
// comparison of renderings also compares which objects are shared.
func render(v any, ids map[any]int) any {
	switch x := v.(type) {
	case nil:
		return []any{"none"}
	case bool:
		return []any{"bool", x}
	case int64:
		return []any{"int", fmt.Sprint(x)}
	case *big.Int:
		return []any{"int", x.String()}
	case float64:
		return []any{"float", fmt.Sprintf("%016x", math.Float64bits(x))}
	case string:
		if utf8.ValidString(x) {
			return []any{"str", x}
		}
		return []any{"strx", hex.EncodeToString([]byte(x))}
	case []byte:
		return []any{"bytes", hex.EncodeToString(x)}
	case ByteArray:
		return []any{"bytearray", hex.EncodeToString(x)}
	case Tuple:
		out := []any{}
		for _, e := range x {
			out = append(out, render(e, ids))
		}
		return []any{"tuple", out}
	case *Set:
		var out []any
		if !x.Frozen {
			if n, ok := ids[x]; ok {
				return []any{"ref", n}
			}
			ids[x] = len(ids)
		}
		for e := range x.All() {
			out = append(out, render(e, ids))
		}
		sortByJSON(out)
		if out == nil {
			out = []any{}
		}
		if x.Frozen {
			return []any{"frozenset", out}
		}
		return []any{"set", ids[x], out}
	case *List:
		if n, ok := ids[x]; ok {
			return []any{"ref", n}
		}
		n := len(ids)
		ids[x] = n
		out := []any{}
		for _, e := range x.All() {
			out = append(out, render(e, ids))
		}
		return []any{"list", n, out}
	case *Dict:
		if n, ok := ids[x]; ok {
			return []any{"ref", n}
		}
		n := len(ids)
		ids[x] = n
		out := []any{}
		for k, e := range x.All() {
			out = append(out, []any{render(k, ids), render(e, ids)})
		}
		return []any{"dict", n, out}
	}
	panic(fmt.Sprintf("render: unexpected %T", v))
}

// sortByJSON orders renderings by their JSON text, as gen.py orders set elements.
func sortByJSON(rs []any) {
	keys := make(map[int]string, len(rs))
	for i, r := range rs {
		keys[i] = pyJSON(r)
	}
	idx := make([]int, len(rs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return keys[idx[a]] < keys[idx[b]] })
	sorted := make([]any, len(rs))
	for i, j := range idx {
		sorted[i] = rs[j]
	}
	copy(rs, sorted)
}

// pyJSON is json.dumps(r) with Python's default separators and ensure_ascii, for sorting like gen.py does.
func pyJSON(r any) string {
	switch x := r.(type) {
	case []any:
		s := "["
		for i, e := range x {
			if i > 0 {
				s += ", "
			}
			s += pyJSON(e)
		}
		return s + "]"
	case string:
		s := `"`
		for _, c := range x {
			switch {
			case c == '"' || c == '\\':
				s += `\` + string(c)
			case c == '\n':
				s += `\n`
			case c == '\r':
				s += `\r`
			case c == '\t':
				s += `\t`
			case c == '\b':
				s += `\b`
			case c == '\f':
				s += `\f`
			case c < 0x20 || c > 0x7e:
				if c > 0xffff {
					c -= 0x10000
					s += fmt.Sprintf(`\u%04x\u%04x`, 0xd800+(c>>10), 0xdc00+(c&0x3ff))
				} else {
					s += fmt.Sprintf(`\u%04x`, c)
				}
			default:
				s += string(c)
			}
		}
		return s + `"`
	case bool:
		if x {
			return "true"
		}
		return "false"
	case int:
		return fmt.Sprint(x)
	}
	panic(fmt.Sprintf("pyJSON: unexpected %T", r))
}

// canonicalJSON re-encodes JSON text so that two renderings compare as strings.
func canonicalJSON(b []byte) (string, error) {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return "", err
	}
	out, err := json.Marshal(v)
	return string(out), err
}
