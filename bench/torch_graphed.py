"""PyTorch's side of `make bench`: eager, torch.cuda.make_graphed_callables
(one callable per layer) and one whole-step graph, on the model that
bench/bench.lua runs through graphcap: L x (Linear(H, H) + GELU), batch B,
forward and backward of the sum. One JSON line per configuration, with the
fields of bench/bench.lua's lines (graph_mem_mib: the bytes reserved by the
private pool of the per-layer graphs; see torch_common.py).

Usage: python3 bench/torch_graphed.py   (needs a CUDA GPU)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

CONFIGS = ((24, 1024, 32), (96, 512, 16), (8, 4096, 4096))  # (L, H, B)
ITERS = 300
UNTIMED = 10


def whole_step_graph(torch, L, H, B, dtype, x):
    """The step of L fresh layers on x captured as one CUDA graph, warmed
    up on a side stream first, as graphcap's g:capture of the step is."""
    layers = tc.stack(torch, L, H, dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            tc.step(layers, x)
    torch.cuda.current_stream().wait_stream(side)
    for m in layers:
        m.zero_grad(set_to_none=True)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tc.step(layers, x)
    torch.cuda.synchronize()
    return graph


def run(torch, L, H, B, dtype):
    torch.manual_seed(0)
    x = torch.randn(B, H, device="cuda", dtype=dtype, requires_grad=True)

    def timed_steps(mods):
        for _ in range(UNTIMED):
            tc.step(mods, x)
        return tc.time_us(torch, lambda: tc.step(mods, x), ITERS)

    layers = tc.stack(torch, L, H, dtype)
    eager_us = timed_steps(layers)

    samples = tuple((torch.randn(B, H, device="cuda", dtype=dtype, requires_grad=True),)
                    for _ in range(L))
    graphed, capture_s, pool = tc.timed_graphing(torch, tuple(layers), samples)
    graph_mib = tc.pools_mib(torch, [pool])
    graphed_us = timed_steps(graphed)

    graph = whole_step_graph(torch, L, H, B, dtype, x)
    for _ in range(UNTIMED):
        graph.replay()
    whole_us = tc.time_us(torch, graph.replay, ITERS)

    tc.emit({"L": L, "H": H, "B": B, "dtype": tc.dtype_name(dtype),
             "eager_us": round(eager_us, 1), "graphed_per_layer_us": round(graphed_us, 1),
             "whole_graph_us": round(whole_us, 1), "capture_s": round(capture_s, 4),
             "graph_mem_mib": round(graph_mib, 2), "torch": torch.__version__})


def main():
    torch = tc.import_torch("torch_graphed.py")
    for dtype in (torch.float32, torch.bfloat16):
        for L, H, B in CONFIGS:  # the first includes cuBLAS start-up, as on graphcap's side
            run(torch, L, H, B, dtype)


if __name__ == "__main__":
    main()
