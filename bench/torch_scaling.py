"""PyTorch's side of the scaling runs of `make bench`: N tiny callables
(Linear(64, 64) + GELU, batch 8, so that host costs dominate) graphed by
torch.cuda.make_graphed_callables, as bench/bench.lua's scaling runs do
with graphcap. One JSON line per N: capture seconds, forward + backward
replay cost per callable, and the bytes the graphs' private pools reserve
with one pool shared by all N callables and with one pool per callable.

Usage: python3 bench/torch_scaling.py   (needs a CUDA GPU; run it in a
process of its own, as bench/bench.lua scaling is)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

H, B, ITERS = 64, 8, 50


def run(torch, n):
    torch.manual_seed(0)
    mods = tc.stack(torch, n, H)
    samples = tuple((torch.randn(B, H, device="cuda", requires_grad=True),) for _ in range(n))
    graphed, capture_s, pool = tc.timed_graphing(torch, tuple(mods), samples)
    shared_mib = tc.pools_mib(torch, [pool])

    x = torch.randn(B, H, device="cuda", requires_grad=True)
    for _ in range(3):
        tc.step(graphed, x)
    per_callable_us = tc.time_us(torch, lambda: tc.step(graphed, x), ITERS) / n

    # one make_graphed_callables, and so one pool, per callable; the graphs
    # stay alive (held by `kept`) until their pools are measured
    kept, pools = [], []
    for i, m in enumerate(tc.stack(torch, n, H)):
        g, _, p = tc.timed_graphing(torch, m, samples[i])
        kept.append(g)
        pools.append(p)
    separate_mib = tc.pools_mib(torch, pools)

    tc.emit({"callables": n, "capture_s": round(capture_s, 4),
             "replay_fwd_bwd_us_per_callable": round(per_callable_us, 2),
             "graph_mem_shared_mib": round(shared_mib, 2),
             "graph_mem_separate_pools_mib": round(separate_mib, 2),
             "torch": torch.__version__})


def main():
    torch = tc.import_torch("torch_scaling.py")
    run(torch, 8)  # start-up costs land here, not in the counted lines
    for n in (8, 32, 128, 512):
        run(torch, n)


if __name__ == "__main__":
    main()
