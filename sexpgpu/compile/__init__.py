"""The compiler: contract forms, staging (tracing tensor ops into IR), autodiff, optimizer
lowering and planning. Registers the tensor builtins and contract forms into the Lisp."""
