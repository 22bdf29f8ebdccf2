package timeline_test

import (
	"bytes"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// TestScan reads whole, cut short and damaged files page by page, and checks the pages cover what
// snapshot.Read reads of them, one after the other, with the same ending: a warning, or the error.
func TestScan(t *testing.T) {
	var b bytes.Buffer
	if err := snapshottest.Encode(&b, snapshottest.Tiny(), snapshot.WithChunkEvents(100)); err != nil {
		t.Fatal(err)
	}
	whole := b.Bytes()
	damaged := bytes.Clone(whole)
	damaged[len(damaged)*2/3] ^= 0xff
	files := map[string][]byte{"whole": whole, "cut short": whole[:len(whole)/2], "damaged": damaged}
	for name, data := range files {
		t.Run(name, func(t *testing.T) {
			want, wantErr := snapshot.Read(bytes.NewReader(data))
			r, err := snapshot.NewReader(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			next, pages := 0, 0
			s, err := timeline.Scan(r, 300, func(tl *timeline.Timeline) {
				if tl.Base() != next || tl.Len()-tl.Base() < 300 && tl.Len() != want.Events.Len() {
					t.Errorf("page [%d, %d) after %d events", tl.Base(), tl.Len(), next)
				}
				next = tl.Len()
				pages++
			})
			if (err == nil) != (wantErr == nil) || next != want.Events.Len() || (s.Warning == nil) != (want.Warning == nil) {
				t.Errorf("scanned %d events in %d pages, err %v, warning %v; Read read %d, err %v, warning %v",
					next, pages, err, s.Warning, want.Events.Len(), wantErr, want.Warning)
			}
			if pages < 2 {
				t.Errorf("%d pages", pages)
			}
		})
	}
}
