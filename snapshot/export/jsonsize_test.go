package export

import (
	"bytes"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// TestTorchJSONSizeIsWhatIsWritten: the size the JSON export announces before it writes, counted with each
// stack encoded once, is the length of what TorchJSON then writes, byte for byte, on real PyTorch snapshots
// (their frames shared by many entries) and on a recording of oomdbg's own.
func TestTorchJSONSizeIsWhatIsWritten(t *testing.T) {
	snaps := map[string]*snapshot.Snapshot{"generated gpt2-small": snapshottest.Trace(snapshottest.Tiny())}
	for _, name := range []string{torchtest.F3, torchtest.F4, torchtest.F9} {
		data := torchtest.OptionalFixture(t, name)
		if data == nil {
			continue
		}
		s, err := torch.Import(data)
		if err != nil {
			t.Fatal(err)
		}
		snaps[name] = s
	}
	for name, s := range snaps {
		t.Run(name, func(t *testing.T) {
			tl := timeline.New(s)
			var buf bytes.Buffer
			if err := TorchJSON(&buf, tl); err != nil {
				t.Fatal(err)
			}
			got, err := TorchJSONSize(tl)
			if err != nil {
				t.Fatal(err)
			}
			if got != int64(buf.Len()) {
				t.Errorf("TorchJSONSize says %d bytes; TorchJSON wrote %d", got, buf.Len())
			}
		})
	}
}
