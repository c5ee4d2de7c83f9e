"""KV pinning between an agent's turns, and program-level FCFS, inside vLLM's engine."""
