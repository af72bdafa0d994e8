"""What a long run watches for growth: each process's memory, threads and open files, and the engine's caches.

A sample is taken every N requests: the engine's and the proxy's resident
memory (the process and its children), threads and open file descriptors
(psutil), and from the engine's `/v1/cache/stats` MLX's active, cache and
peak memory and the prefix cache's bytes in RAM and on disk against their
budgets. `slope_per_1000` fits a line through a figure over the request
count: growth per 1,000 requests, ~0 once the caches are full.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import asdict, dataclass

import psutil

STAT_FIGURES = {
    "ram_cache_bytes": "bytes", "ram_budget_bytes": "budget_bytes",
    "disk_cache_bytes": "disk_bytes", "disk_budget_bytes": "disk_budget_bytes",
    "disk_effective_budget_bytes": "disk_effective_budget_bytes",
    "mlx_active_bytes": "mlx_active_bytes", "mlx_cache_bytes": "mlx_cache_bytes", "mlx_peak_bytes": "mlx_peak_bytes",
}


@dataclass
class ProcessFigures:
    rss_bytes: int
    threads: int
    open_files: int


@dataclass
class Sample:
    requests: int  # requests sent so far, in the whole run
    life: int  # which engine life (a SIGKILL starts the next)
    engine: ProcessFigures
    proxy: ProcessFigures
    ram_cache_bytes: int
    ram_budget_bytes: int
    disk_cache_bytes: int | None
    disk_budget_bytes: int | None
    disk_effective_budget_bytes: int | None
    mlx_active_bytes: int | None
    mlx_cache_bytes: int | None
    mlx_peak_bytes: int | None

    def as_dict(self) -> dict:
        return asdict(self)

    def within_budgets(self) -> bool:
        ram = self.ram_cache_bytes <= self.ram_budget_bytes
        disk = self.disk_cache_bytes is None or self.disk_cache_bytes <= (self.disk_budget_bytes or 0)
        return ram and disk


def process_figures(pid: int) -> ProcessFigures:
    """A process and its children together (vllm-mlx and mitmdump run as one process each today)."""
    root = psutil.Process(pid)
    processes = [root, *root.children(recursive=True)]
    rss = threads = files = 0
    for process in processes:
        try:
            with process.oneshot():
                rss += process.memory_info().rss
                threads += process.num_threads()
                files += process.num_fds()
        except psutil.NoSuchProcess:
            continue
    return ProcessFigures(rss, threads, files)


def engine_stats(engine_url: str) -> dict:
    with urllib.request.urlopen(f"{engine_url}/v1/cache/stats", timeout=60) as response:
        return json.load(response)


def sample(requests: int, life: int, engine_pid: int, proxy_pid: int, engine_url: str) -> Sample:
    stats = engine_stats(engine_url)
    return Sample(requests, life, process_figures(engine_pid), process_figures(proxy_pid),
                  **{name: stats.get(key) for name, key in STAT_FIGURES.items()})


def slope_per_1000(points: list[tuple[float, float]]) -> float | None:
    """Least-squares growth of y per 1,000 of x; None with fewer than 3 points or no spread in x."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None
    return 1000 * sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def figure(sample_: Sample, name: str) -> float | None:
    """A named figure of a sample: `engine_rss_bytes`, `proxy_threads`, `ram_cache_bytes`, ..."""
    owner, _, field_name = name.partition("_")
    if owner in ("engine", "proxy") and field_name in ("rss_bytes", "threads", "open_files"):
        return getattr(getattr(sample_, owner), field_name)
    return getattr(sample_, name)


TRACKED = ("engine_rss_bytes", "proxy_rss_bytes", "engine_threads", "proxy_threads", "engine_open_files", "proxy_open_files",
           "mlx_active_bytes", "mlx_cache_bytes", "ram_cache_bytes", "disk_cache_bytes")


def slopes_once_full(samples: list[Sample]) -> dict[str, float | None]:
    """Per figure, the steepest growth per 1,000 requests within one engine life, over each life's second
    half (its caches filled in the first), so a restart's drop is never counted as a fall."""
    slopes: dict[str, float | None] = {}
    for name in TRACKED:
        per_life = []
        for life in sorted({s.life for s in samples}):
            in_life = [s for s in samples if s.life == life]
            settled = in_life[len(in_life) // 2 :]
            points = [(s.requests, value) for s in settled if (value := figure(s, name)) is not None]
            if (slope := slope_per_1000(points)) is not None:
                per_life.append(slope)
        slopes[name] = max(per_life) if per_life else None
    return slopes
