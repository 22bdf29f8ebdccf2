module github.com/oomdbg/oomdbg

go 1.26

require (
	github.com/NVIDIA/go-nvml v0.13.4-0
	github.com/charmbracelet/x/exp/golden v0.1.0
	github.com/klauspost/compress v1.20.3
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.9
	gonum.org/v1/gonum v0.17.0
	gorgonia.org/cu v0.9.6
)

require (
	github.com/aymanbagabas/go-udiff v0.4.1 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
)
