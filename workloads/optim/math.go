package optim

import "math"

func pow(x float32, n int) float32 { return float32(math.Pow(float64(x), float64(n))) }

func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }
