"""The command line: one module per verb group, dispatched by main.py."""
