# A stand-in for Hugging Face transformers in oomdbg's tests: only what the recorder touches.
