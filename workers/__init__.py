"""Ray actors that run bundles: the same session and training loop as `sexpgpu run`."""
