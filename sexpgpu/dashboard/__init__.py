"""`sexpgpu ui`: a read-only web dashboard of a store, served on 127.0.0.1 by the standard
library's threaded HTTP server, with uPlot (vendored under static/) drawing the curves.
It reads the store only through the run folder's readers and sexpgpu/results; it never
writes, and it knows neither Lisp nor the compiler."""
