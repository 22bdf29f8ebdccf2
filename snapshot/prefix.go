package snapshot

// Prefix returns a read-only view of the first n events of s (all of them when s has no more), as a
// recording stopped after event n-1 would hold them: without the footer, whose summary and final state are
// the whole run's. It shares s's memory, like View.
func (s *Snapshot) Prefix(n int) *Snapshot {
	v := s.View()
	if n >= v.Events.Len() {
		return v
	}
	v.Events.n = max(n-v.Events.base, 0)
	v.Footer = nil
	return v
}
