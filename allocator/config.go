package allocator

import "github.com/oomdbg/oomdbg/internal/torchrules"

// The allocator's settings and size rules are PyTorch's, kept in internal/torchrules so that the importer
// and exporter read them the same way; these names are the allocator's view of them.
type (
	// Config holds the allocator's settings (PYTORCH_CUDA_ALLOC_CONF, the memory fraction, the tie order).
	Config = torchrules.Config
	// ConfigError is a settings string PyTorch would refuse, or one this allocator does not model.
	ConfigError = torchrules.ConfigError
	// Setting is one key:value pair of a settings string.
	Setting = torchrules.Setting
	// TieOrder is the order among cached free blocks of the same stream and size.
	TieOrder = torchrules.TieOrder
)

// The tie orders (torchrules.TieByAddress, torchrules.TieBySegment).
const (
	TieByAddress = torchrules.TieByAddress
	TieBySegment = torchrules.TieBySegment
)

// PyTorch's allocator constants (torchrules).
const (
	MinBlockSize     = torchrules.MinBlockSize
	SmallSize        = torchrules.SmallSize
	SmallBuffer      = torchrules.SmallBuffer
	MinLargeAlloc    = torchrules.MinLargeAlloc
	RoundLarge       = torchrules.RoundLarge
	LargeBuffer      = torchrules.LargeBuffer
	RoundupIntervals = torchrules.RoundupIntervals

	mib = 1 << 20
)

// DefaultConfig returns PyTorch's default allocator configuration.
func DefaultConfig() Config { return Config{} }

// ParseConfig parses a PYTORCH_CUDA_ALLOC_CONF string as PyTorch does (torchrules.ParseConfig) and refuses,
// with a *ConfigError that says so, the settings this allocator does not model: the cudaMallocAsync
// backend and throw_on_cudamalloc_oom:True.
func ParseConfig(s string) (Config, error) {
	cfg, err := torchrules.ParseConfig(s)
	if err != nil {
		return Config{}, err
	}
	if err := modelled(cfg); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// CheckConfig checks cfg against PyTorch's rules (Config.Validate) and refuses what this allocator does not
// model, as ParseConfig does.
func CheckConfig(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	return modelled(cfg)
}

func modelled(cfg Config) error {
	if cfg.Backend == "cudaMallocAsync" {
		return &ConfigError{Key: "backend", Msg: "backend:cudaMallocAsync is not modelled by oomdbg's allocator, which models PyTorch's native caching allocator; use backend:native"}
	}
	if cfg.ThrowOnCudaMallocOOM {
		return &ConfigError{Key: "throw_on_cudamalloc_oom", Msg: "throw_on_cudamalloc_oom:True is not modelled by oomdbg's allocator; remove it to replay with PyTorch's usual OOM recovery"}
	}
	return nil
}
