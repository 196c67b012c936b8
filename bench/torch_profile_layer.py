"""PyTorch's side of bench/profile_layer.lua: `steps` steps of the same
pre-LN transformer layer (bench/torch_transformer.py's), forward and
backward of the sum, for a kernel profiler.

Usage: python3 bench/torch_profile_layer.py [d heads S B steps]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch_transformer as tt  # noqa: E402

d, heads, S, B, steps = (int(v) for v in (sys.argv[1:] + ["768", "12", "1024", "8", "4"][len(sys.argv) - 1:])[:5])
torch.manual_seed(0)
layer = tt.stack(torch, 1, d, heads)[0]
x = torch.randn(S, B, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for _ in range(steps):
    layer(x).sum().backward()
    torch.cuda.synchronize()
