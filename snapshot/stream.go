package snapshot

// Delta is what a Reader has read beyond what a Snapshot holds: the table entries and the end of the file.
// A program that shows a snapshot while it streams in (a pipe, a growing file) reads chunks in one goroutine
// and applies each Delta to its Snapshot in another.
type Delta struct {
	Events  []Event
	Strings []string    // from the Snapshot's len(Strings) on
	Frames  []Frame     // from len(Frames) on
	Stacks  [][]FrameID // from len(Stacks) on
	Footer  *Footer     // set once the end chunk is read
	Warning error
}

// DeltaSince returns the table entries read beyond counts of strings, frames and stacks a Snapshot already
// holds (0, 0, 0 for an empty one), with the footer and warning; the caller adds the events it read with
// ReadChunk. The entries are copies: the Reader may go on reading while the caller uses them.
func (r *Reader) DeltaSince(strings, frames, stacks int) Delta {
	t := &r.tables
	d := Delta{Footer: r.Footer(), Warning: r.Warning()}
	if strings < len(t.strings) {
		d.Strings = append([]string(nil), t.strings[strings:]...)
	}
	if frames < len(t.frames) {
		d.Frames = append([]Frame(nil), t.frames[frames:]...)
	}
	for id := stacks; id < len(t.stackEnds); id++ {
		d.Stacks = append(d.Stacks, append([]FrameID(nil), t.stack(StackID(id))...))
	}
	return d
}

// Apply appends d to s.
func (s *Snapshot) Apply(d Delta) {
	s.Events = append(s.Events, d.Events...)
	s.Strings = append(s.Strings, d.Strings...)
	s.Frames = append(s.Frames, d.Frames...)
	s.Stacks = append(s.Stacks, d.Stacks...)
	if d.Footer != nil {
		s.Footer = d.Footer
	}
	if d.Warning != nil {
		s.Warning = d.Warning
	}
}
