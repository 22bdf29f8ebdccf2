package timeline

import (
	"errors"
	"io"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Scan reads a run from r page by page, so that a run of any length is indexed in the memory of one page:
// f gets the Timeline of each page of about pageEvents events (whole chunks; the last page may hold fewer),
// resumed from the State the page before ended in, and holding that page's events only. Scan returns the
// run's snapshot as the reader left it, with its tables, footer and warning but not its events. Like
// snapshot.Read, a run cut short ends with a Warning and no error, and a damaged one gives f the pages
// before the damage and returns the error.
func Scan(r *snapshot.Reader, pageEvents int, f func(tl *Timeline)) (*snapshot.Snapshot, error) {
	s := &snapshot.Snapshot{}
	s.Events.Forget(0) // read page by page: no room for the whole run
	var st *State
	for {
		err := r.ReadInto(s)
		if held := s.Events.Len() - s.Events.Base(); held > 0 && (held >= pageEvents || err != nil) {
			page := s.View()
			var tl *Timeline
			if st == nil {
				tl = New(page)
			} else {
				tl = Resume(page, *st)
			}
			f(tl)
			next := tl.State()
			st = &next
			s.Events.Forget(s.Events.Len())
		}
		if errors.Is(err, io.EOF) {
			return s, nil
		}
		if err != nil {
			return s, err
		}
	}
}
