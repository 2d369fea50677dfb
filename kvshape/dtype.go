package kvshape

import "fmt"

// DType is the element type of the KV cache.
type DType uint8

// Element types. DTypeInvalid is the zero value so that a Geometry with no
// dtype set fails Validate instead of silently meaning BF16. The values are
// the C ABI's dtype codes.
const (
	DTypeInvalid DType = iota
	BF16
	FP16
	FP8
	FP32
)

// Bytes is the size of one element, 0 for an unknown dtype.
func (d DType) Bytes() int {
	switch d {
	case BF16, FP16:
		return 2
	case FP8:
		return 1
	case FP32:
		return 4
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case BF16:
		return "bf16"
	case FP16:
		return "fp16"
	case FP8:
		return "fp8"
	case FP32:
		return "fp32"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// ParseDType is the inverse of String.
func ParseDType(s string) (DType, error) {
	for d := BF16; d <= FP32; d++ {
		if d.String() == s {
			return d, nil
		}
	}
	return DTypeInvalid, fmt.Errorf("kvshape: unknown dtype %q (want bf16, fp16, fp8 or fp32)", s)
}

// MarshalText and UnmarshalText make a DType read as its name in the store
// manifest and in JSON reports.
func (d DType) MarshalText() ([]byte, error) {
	if d.Bytes() == 0 {
		return nil, fmt.Errorf("kvshape: marshaling invalid dtype %d", uint8(d))
	}
	return []byte(d.String()), nil
}

// UnmarshalText parses a dtype name.
func (d *DType) UnmarshalText(b []byte) error {
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}
