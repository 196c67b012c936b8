"""Helpers shared by the PyTorch side of `make bench` (torch_graphed.py,
torch_scaling.py): the model, timing, the JSON lines, and the bytes a graph
pool holds.

Memory is measured as graphcap measures its own: the bytes reserved by the
private pool the graphs were captured into. PyTorch's caching allocator
tags every segment it reserves with the pool it belongs to; a pool's bytes
are the sum of the sizes of its segments in torch.cuda.memory_snapshot().
A sum of sizes cannot go negative, and other allocations (the warmup, the
eager runs, the collector freeing earlier tensors) do not move it, which a
difference of torch.cuda.memory_allocated() before and after graphing does.

Run on its own (`python3 bench/torch_common.py`) it checks pool_bytes on a
made-up snapshot; that needs no GPU and no torch.
"""
import json
import sys
import time


def stack(torch, L, H, dtype=None):
    """L blocks of Linear(H, H) then GELU on the GPU, in dtype."""
    mods = []
    for _ in range(L):
        m = torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.GELU()).cuda()
        mods.append(m.to(dtype) if dtype is not None else m)
    return mods


def step(mods, x):
    """Forward through mods, backward of the sum."""
    h = x
    for m in mods:
        h = m(h)
    h.sum().backward()


def time_us(torch, fn, iters):
    """Microseconds per call of fn over iters calls, on the host clock from a
    synchronized start to a synchronized end (as bench/bench.lua times)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / iters


def timed_graphing(torch, callables, samples):
    """make_graphed_callables of callables into a fresh private pool, timed
    to completion: (graphed, seconds, pool handle)."""
    pool = torch.cuda.graph_pool_handle()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graphed = torch.cuda.make_graphed_callables(callables, samples, pool=pool)
    torch.cuda.synchronize()
    return graphed, time.perf_counter() - t0, pool


def pool_bytes(snapshot, pool):
    """Bytes reserved by the private pool `pool` (a graph_pool_handle()) in
    the segments of `snapshot` (torch.cuda.memory_snapshot())."""
    want = tuple(pool)
    return sum(seg["total_size"] for seg in snapshot
               if tuple(seg.get("segment_pool_id", ())) == want)


def pools_mib(torch, pools):
    """MiB reserved by the private pools `pools` together, now."""
    snap = torch.cuda.memory_snapshot()
    return sum(pool_bytes(snap, p) for p in pools) / 2**20


def dtype_name(dtype):
    return str(dtype).split(".")[-1]


def emit(record):
    """One JSON line on stdout, now."""
    print(json.dumps(record), flush=True)


def import_torch(script):
    """torch, or exit with a message saying what is missing."""
    try:
        import torch
    except ImportError:
        sys.exit(f"{script}: PyTorch is not installed for {sys.executable}")
    if not torch.cuda.is_available():
        sys.exit(f"{script}: no CUDA GPU visible to PyTorch; this benchmark runs on a GPU")
    return torch


def _self_check():
    snap = [
        {"segment_pool_id": (0, 0), "total_size": 2 << 20},   # the ordinary allocator
        {"segment_pool_id": (1, 7), "total_size": 20 << 20},  # the pool asked about
        {"segment_pool_id": (1, 7), "total_size": 2 << 20},
        {"segment_pool_id": (1, 8), "total_size": 64 << 20},  # another graph pool
    ]
    assert pool_bytes(snap, (1, 7)) == 22 << 20, pool_bytes(snap, (1, 7))
    assert pool_bytes(snap, [1, 8]) == 64 << 20
    assert pool_bytes(snap, (2, 0)) == 0
    assert pool_bytes([], (1, 7)) == 0
    print("torch_common: pool_bytes ok")


if __name__ == "__main__":
    _self_check()
