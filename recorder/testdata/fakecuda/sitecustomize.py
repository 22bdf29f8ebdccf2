# Makes this CPU-only torch look like a CUDA build to the programs a test runs (fakecuda.py says how).
import fakecuda

fakecuda.install()
