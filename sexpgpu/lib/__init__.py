"""The standard modules, written in SexpGPU Lisp: `(require "sexpgpu/NAME" :as prefix)`."""
