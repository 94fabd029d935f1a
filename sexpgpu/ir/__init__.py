"""The IR: a typed SSA graph, the op table, the checker, and text and JSON forms.

Knows nothing of Lisp: a program can be loaded from JSON and run without the language.
"""
