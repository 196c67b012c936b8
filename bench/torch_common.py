"""Helpers shared by the PyTorch side of `make bench` (torch_graphed.py,
torch_scaling.py, torch_transformer.py, torch_fp8.py): the model, timing,
capture, the JSON lines, and the bytes a graph pool holds.

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


def stack(torch, L, H, dtype=None, linear=None):
    """L blocks of Linear(H, H) then GELU on the GPU, in dtype; `linear`: a
    class to use for torch.nn.Linear (torch_fp8.py's FP8 one)."""
    linear = linear or torch.nn.Linear
    mods = []
    for _ in range(L):
        m = torch.nn.Sequential(linear(H, H), torch.nn.GELU()).cuda()
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


def event_us(torch, fn, iters):
    """Microseconds per call of fn over iters calls, between two CUDA events
    recorded on the current stream before the first and after the last."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def capture(torch, fn, before=None, pool=None):
    """fn captured as one CUDA graph (into the private pool `pool`, if
    given), warmed up by 3 calls on a side stream first, before() run
    between the two, as graphcap's g:capture in bench/bench.lua is."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    if before is not None:
        before()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        fn()
    torch.cuda.synchronize()
    return graph


def whole_step_graph(torch, layers, x, pool=None):
    """The step of `layers` on x captured as one CUDA graph, the grads
    cleared after the warmup (so that the graph's backward makes them)."""
    def clear_grads():
        for m in layers:
            m.zero_grad(set_to_none=True)
        x.grad = None
    return capture(torch, lambda: step(layers, x), clear_grads, pool)


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


def with_fp8(record, fp8, model=None):
    """record as the FP8 section's lines have it: with fp8 None (another
    section) unchanged; else "model" first (when given), then "fp8" (true or
    false) and "recipe" (fp8's name, "none" without FP8) after "dtype", as
    in bench/bench.lua's lines."""
    if fp8 is None:
        return record
    out = {} if model is None else {"model": model}
    for k, v in record.items():
        out[k] = v
        if k == "dtype":
            out["fp8"] = fp8 is not False
            out["recipe"] = fp8 or "none"
    return out


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
