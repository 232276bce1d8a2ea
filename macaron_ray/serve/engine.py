"""Ray Serve LLM's vLLM engine, started with the executor the profile asks for.

Ray Serve LLM starts every CPU engine with vLLM's "mp" executor, whatever the
engine kwargs say: three processes per engine (the Serve replica, vLLM's engine
core, and one worker that holds the weights and the KV cache). An engine of
one worker does not need the third: vLLM's "uni" executor runs the model in the
engine-core process. On the local-cpu topology that process held ~0.5 GiB
of PSS per engine of its own (torch, vLLM and their buffers, imported twice),
measured by `macaron bench memory`.

`distributed_executor_backend: uni` in a CPU role's engine kwargs asks for it
(`AppArgs` allows only "mp" or "uni" on CPU, and "uni" only for one worker);
everything else is Ray Serve LLM's own engine.
"""

from __future__ import annotations

from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine


class ProfileExecutorVLLMEngine(VLLMEngine):
    """`VLLMEngine` that keeps the profile's `distributed_executor_backend: uni`."""

    def _start_async_llm_engine(self, vllm_engine_args, vllm_engine_config, placement_group):
        if self.llm_config.engine_kwargs.get("distributed_executor_backend") == "uni":
            vllm_engine_config.parallel_config.distributed_executor_backend = "uni"
        return super()._start_async_llm_engine(vllm_engine_args, vllm_engine_config, placement_group)
