package torchtest

import (
	"encoding/json"
	"strings"
	"testing"
)

// StripToPyTorch returns the JSON form of a PyTorch snapshot (export.TorchJSON's) without what a snapshot
// PyTorch records lacks: the per-entry "category" and "user_metadata" that oomdbg's export adds, and the
// record_function regions it writes for phases and steps (ProfilerStep#N, "forward", "backward", ...). The
// regions torch.optim records around every optimizer step (Optimizer.step#<Class>.step and
// Optimizer.zero_grad#<Class>.zero_grad) stay, as PyTorch 2.x records them. What the import of the result
// infers can then be held against the categories, phases and iterations the recording knew.
func StripToPyTorch(t testing.TB, data []byte) []byte {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("StripToPyTorch: %v", err)
	}
	traces, _ := doc["device_traces"].([]any)
	for _, tr := range traces {
		entries, _ := tr.([]any)
		for _, e := range entries {
			if m, ok := e.(map[string]any); ok {
				delete(m, "category")
				delete(m, "user_metadata")
			}
		}
	}
	if annots, ok := doc["external_annotations"].([]any); ok {
		var keep []any
		for _, a := range annots {
			m, _ := a.(map[string]any)
			name, _ := m["name"].(string)
			if strings.HasPrefix(name, "Optimizer.step#") || strings.HasPrefix(name, "Optimizer.zero_grad#") {
				keep = append(keep, a)
			}
		}
		if keep == nil {
			delete(doc, "external_annotations")
		} else {
			doc["external_annotations"] = keep
		}
	}
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("StripToPyTorch: %v", err)
	}
	return out
}

// StripRegions is StripToPyTorch without the optimizer's regions too: a snapshot of PyTorch before 2.0,
// whose torch.optim recorded none, or of a loop whose optimizer steps outside them.
func StripRegions(t testing.TB, data []byte) []byte {
	t.Helper()
	return edit(t, StripToPyTorch(t, data), func(doc map[string]any) { delete(doc, "external_annotations") })
}

// StripFrames is StripRegions without the frames of every trace entry and block: a snapshot recorded
// without stacks (record_context=False in PyTorch 1.13, context=None since 2.1), where nothing names a
// phase.
func StripFrames(t testing.TB, data []byte) []byte {
	t.Helper()
	return edit(t, StripRegions(t, data), func(doc map[string]any) {
		traces, _ := doc["device_traces"].([]any)
		for _, tr := range traces {
			entries, _ := tr.([]any)
			for _, e := range entries {
				if m, ok := e.(map[string]any); ok {
					delete(m, "frames")
				}
			}
		}
		segs, _ := doc["segments"].([]any)
		for _, sg := range segs {
			m, _ := sg.(map[string]any)
			blocks, _ := m["blocks"].([]any)
			for _, b := range blocks {
				if bm, ok := b.(map[string]any); ok {
					delete(bm, "frames")
				}
			}
		}
	})
}

// edit decodes a JSON snapshot, changes it and encodes it again.
func edit(t testing.TB, data []byte, change func(map[string]any)) []byte {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("strip: %v", err)
	}
	change(doc)
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("strip: %v", err)
	}
	return out
}
