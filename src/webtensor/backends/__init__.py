"""Backends: `cpu` (the numpy reference) and `wgpu` (WebGPU, production)."""
