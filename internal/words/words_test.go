package words

import "testing"

func TestParseAndName(t *testing.T) {
	t.Parallel()
	names := []string{"off", "fp16", "bf16"}
	for s, want := range map[string]int{"": 0, "off": 0, "fp16": 1, "bf16": 2} {
		if got, err := Parse(names, "amp", s); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	if _, err := Parse(names, "amp", "BF16"); err == nil || err.Error() != `unknown amp "BF16" (want off, fp16 or bf16)` {
		t.Errorf("Parse(BF16): %v", err)
	}
	if Name(names, 2, "amp") != "bf16" || Name(names, 7, "amp") != "amp(7)" || Name(names, -1, "amp") != "amp(-1)" {
		t.Error("Name")
	}
	v := 1
	if err := Into(&v, func(s string) (int, error) { return Parse(names, "amp", s) }, []byte("nope")); err == nil || v != 1 {
		t.Errorf("Into kept %d, err %v", v, err)
	}
}
