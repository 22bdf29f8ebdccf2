package tensor

import "fmt"

// DType is a tensor's element type. Values are computed in float32 on the cpu device; a DType decides how
// many bytes each element takes on the device and how values are rounded.
type DType uint8

// The element types.
const (
	F32  DType = iota // torch.float32
	F16               // torch.float16
	BF16              // torch.bfloat16
	I64               // torch.int64: token ids, class labels
	Bool              // torch.bool: masks
	I32               // torch.int32: counters such as the grad scaler's growth tracker
	F64               // torch.float64: the grad scaler's reciprocal of the scale
	U8                // torch.uint8: packed 4-bit weights, 8-bit quantized statistics and optimizer state
)

var dtypeNames = [...]string{F32: "f32", F16: "f16", BF16: "bf16", I64: "i64", Bool: "bool", I32: "i32", F64: "f64", U8: "u8"}
var dtypeSizes = [...]int{F32: 4, F16: 2, BF16: 2, I64: 8, Bool: 1, I32: 4, F64: 8, U8: 1}

// Size is the bytes one element takes on the device.
func (d DType) Size() int { return dtypeSizes[d] }

func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// IsFloat reports whether d holds floating-point values (and so can require a gradient).
func (d DType) IsFloat() bool { return d == F32 || d == F16 || d == BF16 || d == F64 }

// IsHalf reports whether d is a 16-bit float type.
func (d DType) IsHalf() bool { return d == F16 || d == BF16 }

// ParseDType returns the dtype named s ("f32", "fp16", "bf16", ...).
func ParseDType(s string) (DType, error) {
	switch s {
	case "f32", "fp32", "float32":
		return F32, nil
	case "f16", "fp16", "float16":
		return F16, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "i64", "int64":
		return I64, nil
	case "bool":
		return Bool, nil
	case "i32", "int32":
		return I32, nil
	case "f64", "fp64", "float64":
		return F64, nil
	case "u8", "uint8":
		return U8, nil
	}
	return F32, fmt.Errorf("unknown dtype %q (want f32, f16, bf16, f64, i64, i32, u8 or bool)", s)
}
