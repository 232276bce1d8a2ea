"""Node, network and head failures of the container cluster (`macaron_ray.cluster.containers`),
under concurrent multi-turn conversations through the official SDKs, with the fault tier's
bookkeeping (`macaron_ray.chaos`: each client's record, the store before and after, the checks).

    decode_node_lost     SIGKILL the decode pod's container, then start a new one from the same
                         spec (the operator replacing a lost pod)
    prefill_partitioned  the prefill pod off the network for `partition_s`, then back (same address)
    head_killed          SIGKILL the head's container, then start it again; GCS fault tolerance
                         restores Ray's state from the chart's Redis
    redis_restarted      the Redis pod's container restarted (SIGTERM, AOF kept on its volume)

The clients are spread over the proxies of the two api pods, as KubeRay's serve Service spreads
them; every fault leaves those two pods running, so what a client sees is the application's answer
(or a retryable error), never a refused connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from macaron_ray import chaos
from macaron_ray.cluster.containers import ContainerCluster

FAULTS = ("decode_node_lost", "prefill_partitioned", "head_killed", "redis_restarted")


@dataclass(frozen=True)
class Timings(chaos.Timings):
    partition_s: float = 30.0
    """How long the partitioned pod is off the network."""


class StoreView:
    """The chart's Redis, read from this machine at its container's address."""

    def __init__(self, cluster: ContainerCluster):
        self.url = cluster.redis_url()

    def turns(self, tenant: str) -> dict[str, dict]:
        return chaos.stored_turns(self.url, tenant)


class Injector:
    def __init__(self, cluster: ContainerCluster, timings: Timings):
        self.cluster, self.timings = cluster, timings
        self.events: list[tuple[float, str]] = []

    def _note(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    async def inject(self, fault: str) -> None:
        c, plan = self.cluster, self.cluster.plan
        if fault == "decode_node_lost":
            pod = plan.group("decode")[0]
            await asyncio.to_thread(c.kill, pod)
            self._note("decode killed")
            await asyncio.to_thread(c.start, pod)
            self._note("decode pod replaced")
        elif fault == "prefill_partitioned":
            pod = plan.group("prefill")[0]
            await asyncio.to_thread(c.disconnect, pod)
            self._note("prefill disconnected")
            try:
                await asyncio.sleep(self.timings.partition_s)
            finally:
                await asyncio.to_thread(c.reconnect, pod)
                self._note("prefill reconnected")
        elif fault == "head_killed":
            await asyncio.to_thread(c.kill, plan.head)
            self._note("head killed")
            if not await asyncio.to_thread(c.running, plan.head):
                await asyncio.to_thread(c.restart, plan.head)
            self._note("head started")
        elif fault == "redis_restarted":
            pod = plan.group("redis")[0]
            await asyncio.to_thread(c.restart_container, pod)
            self._note("redis restarted")
        else:
            raise ValueError(f"unknown fault {fault!r}; the faults are {', '.join(FAULTS)}")


class ContainerRig(chaos.Rig):
    """`chaos.Rig` on a running container cluster: the load goes to the api pods' proxies through
    the official SDKs, the faults are the cluster's (`FAULTS`), the store is the chart's Redis."""

    sdk = True

    def __init__(self, cluster: ContainerCluster, *, conversations: int = 8, max_tokens: int = 16,
                 timings: Timings = Timings()):
        from macaron_ray.serve.args import AppArgs

        super().__init__(cluster.plan.head.name, conversations=conversations, max_tokens=max_tokens,
                         timings=timings)
        app = next(a for a in cluster.plan.serve_config["applications"] if a["name"] == chaos.APP_NAME)
        self.cluster, self.args = cluster, AppArgs.model_validate(app["args"])

    def _start(self, stack: contextlib.ExitStack) -> None:
        self.redis = StoreView(self.cluster)
        self.private = tuple(s.adapter_id for s in self.args.registry().specialists) + \
            (str(self.args.base_source()),)
        self._start_loop(stack)

    def load_urls(self) -> list[str]:
        return self.cluster.serve_urls()

    def injector(self, load) -> Injector:
        return Injector(self.cluster, self.timings)

    def wait_healthy(self, timeout_s: float = 600) -> None:
        self.cluster.wait_all_running(timeout_s=timeout_s)
