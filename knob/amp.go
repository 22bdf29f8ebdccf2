package knob

import "github.com/oomdbg/oomdbg/internal/words"

// AMP is the mixed-precision setting (--amp): autocast off, in fp16 with dynamic loss scaling, or in bf16.
type AMP uint8

// The AMP settings.
const (
	AMPOff AMP = iota
	AMPFP16
	AMPBF16
)

var ampNames = []string{"off", "fp16", "bf16"}

// ParseAMP reads an AMP setting: off, fp16 or bf16 ("" is off, as older configurations wrote it).
func ParseAMP(s string) (AMP, error) {
	i, err := words.Parse(ampNames, "amp", s)
	return AMP(i), err
}

func (a AMP) String() string                   { return words.Name(ampNames, int(a), "amp") }
func (a AMP) MarshalText() ([]byte, error)     { return []byte(a.String()), nil }
func (a *AMP) UnmarshalText(text []byte) error { return parseInto(a, ParseAMP, text) }

// Attention is the attention's implementation (--attention): naive, which materialises the B×H×T×T scores
// (HF's eager attention), or flash (a fused kernel: sdpa).
type Attention uint8

// The attention kinds.
const (
	AttentionNaive Attention = iota
	AttentionFlash
)

var attentionNames = []string{"naive", "flash"}

// ParseAttention reads an attention setting: naive or flash ("" is naive).
func ParseAttention(s string) (Attention, error) {
	i, err := words.Parse(attentionNames, "attention", s)
	return Attention(i), err
}

func (a Attention) String() string                   { return words.Name(attentionNames, int(a), "attention") }
func (a Attention) MarshalText() ([]byte, error)     { return []byte(a.String()), nil }
func (a *Attention) UnmarshalText(text []byte) error { return parseInto(a, ParseAttention, text) }

// ZeroGrad is how zero_grad clears the gradients (--zero-grad): set them to None (PyTorch's default since
// 2.0), releasing them until the next backward makes them again, or fill them with zeros in place, keeping
// them from the first backward on.
type ZeroGrad uint8

// The zero_grad modes.
const (
	ZeroGradNone ZeroGrad = iota
	ZeroGradZero
)

var zeroGradNames = []string{"none", "zero"}

// ParseZeroGrad reads a zero_grad setting: none or zero ("" is none).
func ParseZeroGrad(s string) (ZeroGrad, error) {
	i, err := words.Parse(zeroGradNames, "zero_grad", s)
	return ZeroGrad(i), err
}

func (z ZeroGrad) String() string                   { return words.Name(zeroGradNames, int(z), "zero_grad") }
func (z ZeroGrad) MarshalText() ([]byte, error)     { return []byte(z.String()), nil }
func (z *ZeroGrad) UnmarshalText(text []byte) error { return parseInto(z, ParseZeroGrad, text) }
