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
	d   *decoder
	err error // the ceiling allows not even an empty Doc: every call fails with it
}

// NewBuilder returns a Builder with the limits l (zero fields take their defaults).
func (l Limits) NewBuilder() *Builder {
	l = l.withDefaults()
	d, err := newDecoder(l, 0, 0)
	if err != nil {
		d, _ = newDecoder(Limits{}.withDefaults(), 0, 0) // an empty Doc for Doc to return
		return &Builder{d: d, err: err}
	}
	return &Builder{d: d}
}

// None and Bool return scalars.
func (b *Builder) None() Value { return mk(tNone, 0) }

func (b *Builder) Bool(x bool) Value {
	if x {
		return mk(tTrue, 0)
	}
	return mk(tFalse, 0)
}

// Int, BigInt and Float return numbers. They fail only when the Doc would pass Limits.MaxMemory.
func (b *Builder) Int(i int64) (Value, error) {
	return b.build(func() (Value, error) { return b.d.int(i) })
}

func (b *Builder) BigInt(x *big.Int) (Value, error) {
	if x.IsInt64() {
		return b.Int(x.Int64())
	}
	return b.build(func() (Value, error) { return b.d.big(new(big.Int).Set(x)) })
}

func (b *Builder) Float(f float64) (Value, error) {
	return b.build(func() (Value, error) { return b.d.float(f) })
}

// Str returns a str; s must be UTF-8.
func (b *Builder) Str(s string) (Value, error) {
	return b.build(func() (Value, error) { return b.d.str([]byte(s)) })
}

// List returns a list of elems.
func (b *Builder) List(elems []Value) (Value, error) {
	return b.build(func() (Value, error) {
		l, err := b.d.newCont(tList)
		if err != nil {
			return 0, err
		}
		return l, b.d.extend(l, elems)
	})
}

// Dict returns a dict of the keys and values in pairs, alternating; a repeated key keeps its last value.
func (b *Builder) Dict(pairs []Value) (Value, error) {
	return b.build(func() (Value, error) {
		m, err := b.d.newCont(tDict)
		if err != nil {
			return 0, err
		}
		return m, b.d.fill(m, pairs)
	})
}

// build runs one step of building, wrapping its error.
func (b *Builder) build(step func() (Value, error)) (Value, error) {
	if b.err != nil {
		return 0, buildErr(b.err)
	}
	v, err := step()
	if err != nil {
		return 0, buildErr(err)
	}
	return v, nil
}

// Doc returns the Doc with root as its top-level value. The Builder must not be used after.
func (b *Builder) Doc(root Value) *Doc {
	b.d.doc.root = root
	return b.d.doc
}

// buildErr wraps a Builder's error, which wraps ErrLimit or ErrMalformed as a decode's does.
func buildErr(err error) error { return fmt.Errorf("pickle: building a value: %w", err) }
