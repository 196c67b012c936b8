"""PyTorch's side of the transformer section of `make bench`: the model that
bench/bench.lua's `transformer` runs through graphcap, L pre-LN
transformer layers (TransformerEngine's TransformerLayer without dropout:
LayerNorm, qkv Linear(d, 3d), causal attention by
F.scaled_dot_product_attention (PyTorch's own fused kernels), Linear(d, d),
residual; LayerNorm, Linear(d, 4d), tanh GELU, Linear(4d, d), residual),
input [seq, batch, d] in bf16, forward and backward of the sum. Eager,
torch.cuda.make_graphed_callables (one callable per layer) and the whole
step as one CUDA graph. One JSON line per configuration, with the fields
of bench/bench.lua's transformer lines (graph_mem_mib: the bytes reserved
by the private pool of the per-layer graphs; see torch_common.py).

Usage: python3 bench/torch_transformer.py   (needs a CUDA GPU)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

# (layers, d, heads, seq, batch): launch-bound, then compute-bound
CONFIGS = ((24, 256, 4, 128, 4), (12, 768, 12, 1024, 8))
ITERS = {256: 200, 768: 30}
UNTIMED = 10


def layer_class(torch, linear=None):
    """The layer, its linears of class `linear` (torch.nn.Linear; torch_fp8.py
    passes its FP8 one)."""
    F = torch.nn.functional
    Linear = linear or torch.nn.Linear

    class Layer(torch.nn.Module):
        """One pre-LN transformer layer on x [S, B, d], causal."""

        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.ln1 = torch.nn.LayerNorm(d, eps=1e-5)
            self.qkv = Linear(d, 3 * d)
            self.proj = Linear(d, d)
            self.ln2 = torch.nn.LayerNorm(d, eps=1e-5)
            self.fc1 = Linear(d, 4 * d)
            self.fc2 = Linear(4 * d, d)

        def forward(self, x):
            S, B, d = x.shape
            h, D = self.heads, d // self.heads
            q, k, v = self.qkv(self.ln1(x)).view(S, B, 3, h, D).permute(2, 1, 3, 0, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, h, S, D]
            x = x + self.proj(a.permute(2, 0, 1, 3).reshape(S, B, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    return Layer


def stack(torch, L, d, heads, linear=None):
    Layer = layer_class(torch, linear)
    return [Layer(d, heads).cuda().to(torch.bfloat16) for _ in range(L)]


def run(torch, L, d, heads, S, B, linear=None, fp8=None):
    """One configuration's line. linear: the Linear class (torch_fp8.py's
    FP8 one); fp8: None, or (the FP8 section) False or the recipe's name."""
    torch.manual_seed(0)
    iters = ITERS.get(d, ITERS[768])
    x = torch.randn(S, B, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def timed_steps(mods):
        for _ in range(UNTIMED):
            tc.step(mods, x)
        return tc.time_us(torch, lambda: tc.step(mods, x), iters)

    eager_us = timed_steps(stack(torch, L, d, heads, linear))

    layers = stack(torch, L, d, heads, linear)
    samples = tuple((torch.randn(S, B, d, device="cuda", dtype=torch.bfloat16,
                                 requires_grad=True),) for _ in range(L))
    graphed, capture_s, pool = tc.timed_graphing(torch, tuple(layers), samples)
    graph_mib = tc.pools_mib(torch, [pool])
    graphed_us = timed_steps(graphed)

    graph = tc.whole_step_graph(torch, stack(torch, L, d, heads, linear), x)
    for _ in range(UNTIMED):
        graph.replay()
    whole_us = tc.time_us(torch, graph.replay, iters)

    tc.emit(tc.with_fp8({"model": "transformer", "L": L, "d": d, "heads": heads, "S": S,
                         "B": B, "dtype": "bfloat16", "eager_us": round(eager_us, 1),
                         "graphed_per_layer_us": round(graphed_us, 1),
                         "whole_graph_us": round(whole_us, 1), "capture_s": round(capture_s, 4),
                         "graph_mem_mib": round(graph_mib, 2), "torch": torch.__version__},
                        fp8))


def main():
    torch = tc.import_torch("torch_transformer.py")
    for cfg in CONFIGS:
        run(torch, *cfg)


if __name__ == "__main__":
    main()
