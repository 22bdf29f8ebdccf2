package snapshottest

import (
	"encoding/binary"

	"github.com/oomdbg/oomdbg/snapshot"
)

// memSink collects a trace in memory. It interns independently of snapshot.Writer, by the same rule (dense
// IDs in first-use order, 0 for "" and the empty stack), so that it is a truth to test the Writer against.
type memSink struct {
	events   snapshot.Events
	strings  []string
	frames   []snapshot.Frame
	stacks   [][]snapshot.FrameID
	stringID map[string]snapshot.StringID
	frameID  map[snapshot.Frame]snapshot.FrameID
	stackID  map[string]snapshot.StackID
}

func newMemSink() *memSink {
	return &memSink{
		strings:  []string{""},
		frames:   []snapshot.Frame{{}},
		stacks:   [][]snapshot.FrameID{nil},
		stringID: make(map[string]snapshot.StringID),
		frameID:  make(map[snapshot.Frame]snapshot.FrameID),
		stackID:  make(map[string]snapshot.StackID),
	}
}

func (m *memSink) InternString(s string) snapshot.StringID {
	if s == "" {
		return 0
	}
	if id, ok := m.stringID[s]; ok {
		return id
	}
	id := snapshot.StringID(len(m.strings))
	m.strings = append(m.strings, s)
	m.stringID[s] = id
	return id
}

func (m *memSink) InternFrame(function, file string, line int) snapshot.FrameID {
	f := snapshot.Frame{Function: m.InternString(function), File: m.InternString(file), Line: int32(line)}
	if id, ok := m.frameID[f]; ok {
		return id
	}
	id := snapshot.FrameID(len(m.frames))
	m.frames = append(m.frames, f)
	m.frameID[f] = id
	return id
}

func (m *memSink) InternStack(frames []snapshot.FrameID) snapshot.StackID {
	if len(frames) == 0 {
		return 0
	}
	var key []byte
	for _, f := range frames {
		key = binary.LittleEndian.AppendUint32(key, uint32(f))
	}
	if id, ok := m.stackID[string(key)]; ok {
		return id
	}
	id := snapshot.StackID(len(m.stacks))
	m.stacks = append(m.stacks, append([]snapshot.FrameID(nil), frames...))
	m.stackID[string(key)] = id
	return id
}

func (m *memSink) Write(e *snapshot.Event) error {
	e.Seq = uint64(m.events.Len())
	m.events.Append(e)
	return nil
}
