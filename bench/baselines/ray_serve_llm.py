"""Stock Ray Serve LLM (`ray.serve.llm.build_openai_app`, default router) on the
benchmark's engine settings. Runs until SIGTERM or SIGINT, then shuts down Ray."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.systems import EngineSettings
from cluster.signals import stop_on_signals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settings", type=Path, required=True, help="EngineSettings JSON")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    args = parser.parse_args()
    settings = EngineSettings(**json.loads(args.settings.read_text()))

    import ray
    from ray import serve
    from ray.serve.llm import LLMConfig, build_openai_app

    ray.init(
        address="local",
        # Logical CPUs: Ray Serve LLM's default reservations (1 CPU for the ingress,
        # a placement group for the engine) do not fit on a 2-core node and the
        # ingress would never be scheduled. The engine's threads are bound by
        # VLLM_CPU_OMP_THREADS_BIND regardless of this count.
        num_cpus=max(8, os.cpu_count() or 1),
        include_dashboard=False,
        log_to_driver=False,
        _metrics_export_port=args.metrics_port,
    )
    stop_on_signals()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        llm_config = LLMConfig(
            model_loading_config={
                "model_id": settings.served_model_name,
                "model_source": settings.model_path,
            },
            accelerator_config={"kind": "cpu"},
            engine_kwargs=settings.vllm_engine_kwargs(),
            runtime_env={"env_vars": settings.process_environment()},
        )
        serve.run(build_openai_app({"llm_configs": [llm_config]}), blocking=False)
        print("[ray-serve-llm] application deployed", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
