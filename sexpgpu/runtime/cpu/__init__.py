"""The compiled CPU device: the lowering's programs (runtime/lower/) with their kernels emitted as host C, compiled, and run through ctypes."""
