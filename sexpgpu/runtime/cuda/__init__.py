"""The CUDA device: lowering (fusion, kernels generated from the IR, cuBLAS calls), the device memory arena, and the lowering report."""
