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


def run(torch, L, H, B, dtype, linear=None, fp8=None):
    """One configuration's line. linear: the Linear class (torch_fp8.py's
    FP8 one); fp8: None, or (the FP8 section) False or the recipe's name."""
    torch.manual_seed(0)
    x = torch.randn(B, H, device="cuda", dtype=dtype, requires_grad=True)

    def timed_steps(mods):
        for _ in range(UNTIMED):
            tc.step(mods, x)
        return tc.time_us(torch, lambda: tc.step(mods, x), ITERS)

    layers = tc.stack(torch, L, H, dtype, linear)
    eager_us = timed_steps(layers)

    samples = tuple((torch.randn(B, H, device="cuda", dtype=dtype, requires_grad=True),)
                    for _ in range(L))
    graphed, capture_s, pool = tc.timed_graphing(torch, tuple(layers), samples)
    graph_mib = tc.pools_mib(torch, [pool])
    graphed_us = timed_steps(graphed)

    # the whole step as one graph, on fresh layers
    graph = tc.whole_step_graph(torch, tc.stack(torch, L, H, dtype, linear), x)
    for _ in range(UNTIMED):
        graph.replay()
    whole_us = tc.time_us(torch, graph.replay, ITERS)

    tc.emit(tc.with_fp8({"L": L, "H": H, "B": B, "dtype": tc.dtype_name(dtype),
                         "eager_us": round(eager_us, 1),
                         "graphed_per_layer_us": round(graphed_us, 1),
                         "whole_graph_us": round(whole_us, 1), "capture_s": round(capture_s, 4),
                         "graph_mem_mib": round(graph_mib, 2), "torch": torch.__version__},
                        fp8, "mlp"))


def main():
    torch = tc.import_torch("torch_graphed.py")
    for dtype in (torch.float32, torch.bfloat16):
        for L, H, B in CONFIGS:  # the first includes cuBLAS start-up, as on graphcap's side
            run(torch, L, H, B, dtype)


if __name__ == "__main__":
    main()
