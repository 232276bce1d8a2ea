"""Memory of a running topology: every process of one Ray session, engines included.

Per-process RSS counts shared pages (torch, vLLM's libraries) once per process,
so a sum of RSS overstates what the machine holds; PSS splits each shared page
between the processes that map it, and its sum is what the topology costs.
Both are reported.
"""

from __future__ import annotations

from pathlib import Path

import psutil


def session_processes(session_name: str) -> list[psutil.Process]:
    """The processes whose command line names the session, and all their descendants.

    Ray's own daemons (GCS, raylet, dashboard, monitors) carry the session dir in
    their arguments; workers, Serve replicas and vLLM's engine processes descend
    from them.
    """
    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(session_name in arg for arg in proc.info["cmdline"] or ()):
            roots.append(proc)
    seen: dict[int, psutil.Process] = {}
    for root in roots:
        for proc in [root, *_children(root)]:
            seen.setdefault(proc.pid, proc)
    return list(seen.values())


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def topology_memory(session_dir: Path) -> dict:
    """RSS and PSS sums (bytes) of the session's processes, and the five largest by PSS."""
    rss = pss = 0
    largest = []
    procs = session_processes(Path(session_dir).resolve().name)
    for proc in procs:
        try:
            info = proc.memory_full_info()
            name = proc.name()
        except psutil.Error:
            continue  # ended while we looked
        rss += info.rss
        pss += info.pss
        largest.append((info.pss, name))
    largest.sort(reverse=True)
    return {"processes": len(procs), "rss_bytes": rss, "pss_bytes": pss,
            "largest_pss": [{"name": n, "pss_bytes": b} for b, n in largest[:5]]}
