package snapshot

// ReadInto reads the next chunk into s: its events onto s.Events, its new table entries onto s's tables, and
// the footer and warning once the input ends. s must be empty or filled by earlier calls on the same Reader.
// It returns io.EOF after the last chunk, a *DecodeError for damaged input (s then holds what came before).
//
// A program that shows a snapshot while it streams in (a pipe, a growing file) reads with ReadInto in one
// goroutine and hands View copies to another: what ReadInto adds never changes what a View holds.
func (r *Reader) ReadInto(s *Snapshot) error {
	err := r.ReadChunk(&s.Events)
	t := &r.tables
	s.Meta = r.meta
	s.Strings, s.Frames = t.strings, t.frames
	if len(s.Stacks) == 0 {
		s.Stacks = append(s.Stacks, nil)
	}
	for id := len(s.Stacks); id < len(t.stackEnds); id++ {
		s.Stacks = append(s.Stacks, t.stack(StackID(id)))
	}
	s.Footer, s.Warning = r.Footer(), r.Warning()
	return err
}

// View returns a read-only copy of s that shares its memory. It stays valid while s grows by ReadInto or
// Events.Append: they only add to what s holds.
func (s *Snapshot) View() *Snapshot {
	v := *s
	v.Events = s.Events.View()
	v.Strings, v.Frames, v.Stacks = clip(s.Strings), clip(s.Frames), clip(s.Stacks)
	return &v
}
