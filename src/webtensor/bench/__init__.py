"""Benchmarks: `webtensor bench` (GPT-2 prefill / decode, side by side with HF transformers)."""
