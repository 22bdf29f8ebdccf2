package pickle

import (
	"fmt"
	"math/big"
)

// Builder makes a Doc from values that were never pickled (a snapshot saved as JSON), so that code reading
// snapshots reads one form. It applies the checks and limits a decode does: containers may not nest deeper
// than MaxDepth or hold more than MaxItems, and a dict's keys must be hashable. A Builder's Values belong to
// the Doc it returns.
type Builder struct {
	d decoder
}

// NewBuilder returns a Builder with the limits l (zero fields take their defaults).
func (l Limits) NewBuilder() *Builder {
	b := &Builder{d: decoder{lim: l.withDefaults(), doc: newDoc(0)}}
	b.d.keys.budget = keyWorkBase
	b.d.mat.doc = b.d.doc
	return b
}

// None, Bool, Int, BigInt and Float return scalars.
func (b *Builder) None() Value { return mk(tNone, 0) }

func (b *Builder) Bool(x bool) Value {
	if x {
		return mk(tTrue, 0)
	}
	return mk(tFalse, 0)
}

func (b *Builder) Int(i int64) Value { return b.d.int(i) }

func (b *Builder) BigInt(x *big.Int) Value {
	if x.IsInt64() {
		return b.d.int(x.Int64())
	}
	return b.d.big(new(big.Int).Set(x))
}

func (b *Builder) Float(f float64) Value { return b.d.float(f) }

// Str returns a str; s must be UTF-8.
func (b *Builder) Str(s string) (Value, error) {
	v, err := b.d.str([]byte(s))
	if err != nil {
		return 0, buildErr(err)
	}
	return v, nil
}

// List returns a list of elems.
func (b *Builder) List(elems []Value) (Value, error) {
	l := b.d.newCont(tList)
	if err := b.d.extend(l, elems); err != nil {
		return 0, buildErr(err)
	}
	return l, nil
}

// Dict returns a dict of the keys and values in pairs, alternating; a repeated key keeps its last value.
func (b *Builder) Dict(pairs []Value) (Value, error) {
	m := b.d.newCont(tDict)
	if err := b.d.fill(m, pairs); err != nil {
		return 0, buildErr(err)
	}
	return m, nil
}

// Doc returns the Doc with root as its top-level value. The Builder must not be used after.
func (b *Builder) Doc(root Value) *Doc {
	b.d.doc.root = root
	return b.d.doc
}

// buildErr wraps a Builder's error, which wraps ErrLimit or ErrMalformed as a decode's does.
func buildErr(err error) error { return fmt.Errorf("pickle: building a value: %w", err) }
