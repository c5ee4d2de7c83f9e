"""What runs inside vLLM's EngineCore process: the engine's arguments, the
schedulers composed of each mechanism's mixin, the plugin a replica reaches them
through. `pinning/`, `prompt_lookup/` and `admission/` never import each other."""
