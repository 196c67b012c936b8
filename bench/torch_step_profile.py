# One eager step of L x (Linear(H, H) + GELU), batch B, forward + backward of
# the sum, for ncu: three warm-up steps, then the profiled one.
import sys, torch
L, H, B = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
dt = torch.bfloat16 if sys.argv[4] == "bf16" else torch.float32
dev = "cuda"
layers = [torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.GELU()).to(dev, dt) for _ in range(L)]
x = torch.randn(B, H, device=dev, dtype=dt, requires_grad=True)
def step():
    h = x
    for m in layers: h = m(h)
    h.sum().backward()
for _ in range(3): step()
torch.cuda.synchronize()
step()
torch.cuda.synchronize()
