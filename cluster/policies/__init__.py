"""The serving policies as plain classes: no Ray, vLLM, Redis or HTTP, so the
engine's schedulers, the ingress and the benchmark drive the same code."""
