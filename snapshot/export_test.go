package snapshot

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Dump writes a readable listing of a snapshot's bytes: the header, every chunk's framing and decoded
// payload, and each event's bytes beside its fields. The golden test pins it, so that a change to the
// encoding shows as a readable diff, and docs/format.md can point at a worked example.
//
// The bytes of each event are found by encoding the decoded events again; Dump fails if that does not give
// back the chunk's streams, which also checks that the encoding is deterministic.
func Dump(w io.Writer, data []byte) error {
	p := &dumper{w: w}
	return p.dump(data)
}

type dumper struct {
	w   io.Writer
	err error
}

func (p *dumper) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func (p *dumper) dump(data []byte) error {
	if len(data) < fileHeaderSize {
		return fmt.Errorf("short header")
	}
	metaLen := int(binary.LittleEndian.Uint32(data[12:]))
	p.printf("header @0\n")
	p.printf("  magic    % x %q\n", data[:8], data[:8])
	p.printf("  version  % x = %d\n", data[8:10], binary.LittleEndian.Uint16(data[8:]))
	p.printf("  flags    % x\n", data[10:12])
	p.printf("  metadata % x = %d bytes\n", data[12:16], metaLen)
	var meta bytes.Buffer
	if err := json.Indent(&meta, data[16:16+metaLen], "    ", "  "); err != nil {
		return err
	}
	p.printf("    %s\n", meta.String())
	off := 16 + metaLen
	p.printf("  crc32c   % x\n", data[off:off+4])
	off += 4

	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return err
	}
	defer dec.Close()
	var src chunkSource
	if err := dec.Reset(&src); err != nil {
		return err
	}
	var m model
	tabs := newTables()
	enc := newEventEncoder()
	lim := DefaultLimits()
	for off < len(data) {
		h := data[off : off+chunkHeaderSize]
		kind, codec := h[0], h[1]
		stored := int(binary.LittleEndian.Uint32(h[4:]))
		raw := int(binary.LittleEndian.Uint32(h[8:]))
		count := int(binary.LittleEndian.Uint32(h[12:]))
		p.printf("\nchunk @%d\n", off)
		p.printf("  header   % x\n", h)
		p.printf("           kind %d, codec %d, stored %d, decoded %d, events %d, payload crc %08x, header crc %08x\n",
			kind, codec, stored, raw, count, binary.LittleEndian.Uint32(h[16:]), binary.LittleEndian.Uint32(h[20:]))
		payload := data[off+chunkHeaderSize : off+chunkHeaderSize+stored]
		off += chunkHeaderSize + stored
		if codec == codecZstd {
			src.b = payload
			buf := make([]byte, raw)
			if _, err := io.ReadFull(dec, buf); err != nil {
				return err
			}
			payload = buf
		}
		if kind == kindEnd {
			if len(payload) == 0 {
				p.printf("  end, no footer\n")
			} else {
				p.printf("  end, footer %s\n", payload)
			}
			continue
		}
		s0, f0, k0 := tabs.numStrings(), tabs.numFrames(), tabs.numStacks()
		rest, err := tabs.decodeSection(payload, &lim)
		if err != nil {
			return err
		}
		p.printf("  tables   % x\n", payload[:len(payload)-len(rest)])
		for id := s0 + 1; id <= tabs.numStrings(); id++ {
			p.printf("    string %d %q\n", id, tabs.strings[id])
		}
		for id := f0 + 1; id <= tabs.numFrames(); id++ {
			f := tabs.frames[id]
			p.printf("    frame %d function %d file %d line %d\n", id, f.Function, f.File, f.Line)
		}
		for id := k0 + 1; id <= tabs.numStacks(); id++ {
			p.printf("    stack %d %v\n", id, tabs.stack(StackID(id)))
		}
		c := cursor{b: rest}
		opsLen := int(c.uvarint())
		ops := rest[c.i : c.i+opsLen]
		c.i += opsLen
		fieldsLen := int(c.uvarint())
		fields := rest[c.i : c.i+fieldsLen]
		times := rest[c.i+fieldsLen:]
		p.printf("  streams  ops %d, fields %d, times %d bytes\n", len(ops), len(fields), len(times))
		events, err := m.decodeEvents(nil, count, ops, fields, times, tabs.numStrings(), tabs.numStacks())
		if err != nil {
			return err
		}
		for _, e := range events {
			o, f, t := len(enc.ops), len(enc.fields), len(enc.times)
			enc.encode(&e)
			op := enc.ops[o]
			p.printf("  %3d %-14s %-5s %-34s ops % -9x fields % x; time % x\n", e.Seq, e.Action,
				modeNames[op>>opModeShift&opModeMask], flagNames(enc.ops[o:]), enc.ops[o:], enc.fields[f:], enc.times[t:])
			p.printf("      %s\n", describe(&e))
		}
		if !bytes.Equal(enc.ops, ops) || !bytes.Equal(enc.fields, fields) || !bytes.Equal(enc.times, times) {
			return fmt.Errorf("chunk @%d: encoding the decoded events again gives different bytes", off)
		}
		enc.reset()
	}
	return p.err
}

var modeNames = [...]string{modeBase: "base", modeRing: "ring", modePrev: "prev", modeDelta: "delta"}

var flagNameList = [...]string{"size", "label", "stack", "scope", "category", "text", "block", "phase", "context",
	"devfree", "holder", "parent"}

// flagNames names the flags of an event's ops bytes.
func flagNames(op []byte) string {
	if op[0]&opExt == 0 {
		return "-"
	}
	c := cursor{b: op[1:]}
	flags := c.uvarint()
	var names []string
	for i, n := range flagNameList {
		if flags&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	return strings.Join(names, ",")
}

// describe lists an event's non-zero fields.
func describe(e *Event) string {
	s := fmt.Sprintf("time %d phase %v iteration %d", e.Time, e.Phase, e.Iteration)
	add := func(name string, v any, set bool) {
		if set {
			s += fmt.Sprintf(" %s %v", name, v)
		}
	}
	add("device", e.Device, e.Device != 0)
	add("stream", e.Stream, e.Stream != 0)
	add("addr", fmt.Sprintf("%#x", e.Addr), e.Addr != 0)
	add("size", e.Size, e.Size != 0)
	add("block", e.BlockSize, e.BlockSize != 0)
	add("devfree", e.DeviceFree, e.DeviceFree != 0)
	add("category", e.Category, e.Category != 0)
	add("scope", e.Scope, e.Scope != 0)
	add("label", e.Label, e.Label != 0)
	add("stack", e.Stack, e.Stack != 0)
	add("text", e.Text, e.Text != 0)
	add("holder", e.Holder, e.Holder != 0)
	add("parent", e.Parent, e.Parent != 0)
	return s
}
