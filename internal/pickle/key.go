package pickle

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"slices"
)

// Comparable stand-ins for key types that Go cannot compare, or that Python compares differently from Go.
type (
	noneKey   struct{}
	bigKey    string // sign and magnitude bytes of an integer outside int64
	bytesKey  string // bytes: never equal to a str with the same content
	tupleKey  string // encode form of a tuple
	frozenKey string // encode form of a frozenset, elements sorted so order does not matter
)

// keyHasher computes hash keys: comparable Go values that are equal exactly when Python's dict treats two keys
// as the same (bool and integral floats collapse onto ints, bytes stay apart from str). Hashing is the one
// place where work is not proportional to the bytes read: one SETITEM of a memoized tuple of tuples can ask
// for an encoding exponential in its nesting. So it draws on a budget of bytes, and remembers the key of each
// tuple, frozenset and big int it has seen, so a shared key is encoded once.
type keyHasher struct {
	budget int64
	seen   map[any]any // *any (a tuple's first element), *Set or *big.Int → its hash key
	mem    *meter      // in a decode: the keys it makes and remembers are held, so counted
}

// hashKeyBudget bounds a hash key built outside a decode (Dict.Lookup), where no input size sets one.
const hashKeyBudget = 1 << 20

// keyWorkPerByte and keyWorkBase set a decode's budget: hashing may process keyWorkPerByte bytes per input
// byte, plus keyWorkBase. A snapshot's keys are short strings and cost nothing.
const (
	keyWorkPerByte = 16
	keyWorkBase    = 1 << 20
)

var errKeyBudget = fmt.Errorf("%w: hashing dict keys and set elements would take more than %d bytes of work per input byte (deeply shared tuple keys?)",
	ErrLimit, keyWorkPerByte)

// charge spends n bytes of budget.
func (h *keyHasher) charge(n int) error {
	h.budget -= int64(n)
	if h.budget < 0 {
		return errKeyBudget
	}
	if h.mem != nil {
		return h.mem.add(int64(n))
	}
	return nil
}

// hashKey returns k's hash key, or an error for an unhashable type (list, dict, set, bytearray).
func (h *keyHasher) hashKey(k any) (any, error) {
	switch x := k.(type) {
	case string:
		return x, nil
	case int64:
		return x, nil
	case nil:
		return noneKey{}, nil
	case bool:
		if x {
			return int64(1), nil
		}
		return int64(0), nil
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), nil
		}
		if hk, ok := h.seen[x]; ok {
			return hk, nil
		}
		hk, err := h.big(x)
		if err != nil {
			return nil, err
		}
		return h.remember(x, hk), nil
	case float64:
		return h.float(x)
	case []byte:
		if err := h.charge(len(x)); err != nil {
			return nil, err
		}
		return bytesKey(x), nil
	case Tuple:
		if len(x) == 0 {
			return tupleKey("T\x00"), nil // as encode writes it
		}
		if hk, ok := h.seen[&x[0]]; ok {
			return hk, nil
		}
		b, err := h.encode(x)
		if err != nil {
			return nil, err
		}
		return h.remember(&x[0], tupleKey(b)), nil
	case *Set:
		if !x.Frozen {
			break
		}
		if hk, ok := h.seen[x]; ok {
			return hk, nil
		}
		b, err := h.encode(x)
		if err != nil {
			return nil, err
		}
		return h.remember(x, frozenKey(b)), nil
	}
	return nil, malformed("unhashable dict key or set element of type %s", typeName(k))
}

func (h *keyHasher) remember(id, hk any) any {
	if h.seen == nil {
		h.seen = make(map[any]any)
	}
	if h.mem != nil && h.mem.add(mapEntryBytes) != nil {
		return hk // not remembered: the next use encodes it again, charging the budget again
	}
	h.seen[id] = hk
	return hk
}

func (h *keyHasher) big(x *big.Int) (any, error) {
	b := x.Bytes()
	if err := h.charge(len(b) + 1); err != nil {
		return nil, err
	}
	sign := "+"
	if x.Sign() < 0 {
		sign = "-"
	}
	return bigKey(sign + string(b)), nil
}

// float maps an integral float onto the int it equals (Python: 2.0 == 2 and hash(2.0) == hash(2)).
func (h *keyHasher) float(f float64) (any, error) {
	if f != math.Trunc(f) || math.IsInf(f, 0) {
		return f, nil // also NaN, which never equals anything, as in Python for distinct NaN objects
	}
	if f >= -(1<<63) && f < 1<<63 {
		return int64(f), nil
	}
	i, _ := big.NewFloat(f).Int(nil)
	return h.big(i)
}

// encode returns a canonical encoding of a tuple or frozenset: equal keys encode equally. Elements are
// encoded through hashKey, so a nested tuple seen before is not walked again.
func (h *keyHasher) encode(v any) ([]byte, error) {
	var elems []any
	tag := byte('T')
	switch x := v.(type) {
	case Tuple:
		elems = x
	case *Set:
		tag = 'Z'
		for e := range x.All() {
			elems = append(elems, e)
		}
	}
	parts := make([][]byte, len(elems))
	n := 0
	for i, e := range elems {
		b, err := h.appendKey(nil, e)
		if err != nil {
			return nil, err
		}
		parts[i] = b
		n += len(b)
	}
	if err := h.charge(n + 1); err != nil {
		return nil, err
	}
	if tag == 'Z' {
		slices.SortFunc(parts, bytes.Compare) // a set's order is not part of its value
	}
	buf := binary.AppendUvarint(append(make([]byte, 0, n+11), tag), uint64(len(parts)))
	for _, b := range parts {
		buf = append(buf, b...)
	}
	return buf, nil
}

// appendKey appends the tagged, self-delimiting hash key of one element.
func (h *keyHasher) appendKey(buf []byte, e any) ([]byte, error) {
	hk, err := h.hashKey(e)
	if err != nil {
		return nil, err
	}
	switch x := hk.(type) {
	case noneKey:
		return append(buf, 'N'), nil
	case int64:
		return binary.LittleEndian.AppendUint64(append(buf, 'I'), uint64(x)), nil
	case float64:
		return binary.LittleEndian.AppendUint64(append(buf, 'F'), math.Float64bits(x)), nil
	case bigKey:
		return appendString(append(buf, 'L'), string(x)), nil
	case string:
		return appendString(append(buf, 'S'), x), nil
	case bytesKey:
		return appendString(append(buf, 'Y'), string(x)), nil
	case tupleKey:
		return appendString(append(buf, 't'), string(x)), nil
	case frozenKey:
		return appendString(append(buf, 'z'), string(x)), nil
	}
	return nil, malformed("unhashable value of type %s", typeName(e))
}

func appendString(buf []byte, s string) []byte {
	return append(binary.AppendUvarint(buf, uint64(len(s))), s...)
}

// typeName names a decoded value's Python type, for error messages.
func typeName(v any) string {
	switch v := v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case ByteArray:
		return "bytearray"
	case *List:
		return "list"
	case *Dict:
		return "dict"
	case Tuple:
		return "tuple"
	case *Set:
		if v.Frozen {
			return "frozenset"
		}
		return "set"
	}
	return "unknown"
}
