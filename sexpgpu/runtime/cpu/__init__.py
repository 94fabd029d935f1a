"""The compiled CPU device: the CUDA lowering's programs with their kernels emitted as C."""
