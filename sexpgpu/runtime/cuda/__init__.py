"""The CUDA device: the lowering's programs (runtime/lower/) compiled by NVRTC, cached as cubins, and run through CuPy and cuBLAS."""
