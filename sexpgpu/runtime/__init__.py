"""The runtime: executes IR programs (NumPy backend), runs the one training loop, and writes
the run folder through the store. Knows neither Lisp nor the compiler."""
