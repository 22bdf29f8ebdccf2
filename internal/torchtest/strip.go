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
