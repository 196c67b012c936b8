"""PyTorch's side of the FP8 section of `make bench` (bench/bench.lua fp8),
each measurement in bf16 and in FP8, so that ratios come from the lines of
one run:

- gemm: [M, K] x [K, N] (8192 each), forward only, no autograd: bf16 as
  Linear(K, N, bias=False) computes it (torch.matmul(x, w.t())); "prequantized",
  torch._scaled_mm alone on operands quantized beforehand; and
  "Float8CurrentScaling", both operands quantized in the timed call and
  then torch._scaled_mm, as graphcap's FP8 Linear runs each call. Eager
  (host clock, as the other scripts) and one call captured as a CUDA graph,
  its replays timed with CUDA events; tflops = 2 M N K over a replay.
- mlp: bench/torch_graphed.py's model at its large configuration (8 x
  Linear(4096, 4096) + GELU, batch 4096, bf16, forward and backward of the
  sum), through torch_graphed.run: eager, make_graphed_callables per layer,
  the whole step as one torch.cuda.graph. FP8: each Linear is Fp8Linear.
- transformer: bench/torch_transformer.py's compute-bound configuration (12
  x d 768, S 1024, B 8), through torch_transformer.run, its four Linears per
  layer Fp8Linear under FP8 (the attention stays bf16, as TransformerEngine's).

Fp8Linear is a small autograd.Function, TransformerEngine's Float8CurrentScaling
recipe with its HYBRID format: per-tensor scales taken from each tensor's
own amax right before its cast (scale = fp8_max / amax, 1 where the amax is
0 or not finite), computed on the device (no host sync, so it captures).
Forward: input and weight to E4M3 (448), torch._scaled_mm with the bias in
its epilogue; backward: the grad to E5M2 (57344), dgrad and wgrad with
torch._scaled_mm, the bias grad from the unquantized grad. GELU runs in
bf16. torch._scaled_mm takes the inverse scales (out = (a * scale_a) @ (b *
scale_b)), a row-major and b column-major, each dim a multiple of 16; fast
accumulation in the forward GEMM only, as TransformerEngine's defaults. The
quantization is eager PyTorch (amax, scale, cast: a few kernels each),
unfused. graphcap's lines have the same fields (graph_mem_mib: the private
pool of the per-layer graphs for mlp and transformer, of the one graph for
gemm; see torch_common.py).

Usage: python3 bench/torch_fp8.py [tiny]   (needs a CUDA GPU of compute
capability 8.9 or later; elsewhere it says so and exits 0). `tiny`: small
sizes, for a quick check that it runs.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402
import torch_graphed as tg  # noqa: E402
import torch_transformer as tt  # noqa: E402

RECIPE = "Float8CurrentScaling"
E4M3_MAX, E5M2_MAX = 448.0, 57344.0
GEMM_ITERS = 50
UNTIMED = 10
# (gemm M = N = K), (L, H, B) of the MLP, (L, d, heads, S, B) of the transformer
FULL = (8192, (8, 4096, 4096), (12, 768, 12, 1024, 8))
TINY = (64, (2, 64, 32), (2, 64, 2, 16, 2))


def quantize(torch, t, fp8_dtype, fp8_max):
    """t (contiguous) cast to fp8_dtype with its current per-tensor scale,
    all on the device: (the FP8 tensor, the inverse scale as a 0-dim float32
    tensor, which torch._scaled_mm takes)."""
    amax = t.abs().amax().float()
    ok = torch.isfinite(amax) & (amax > 0)
    scale = torch.where(ok, fp8_max / amax, torch.ones_like(amax))
    scale = scale.clamp(max=torch.finfo(torch.float32).max)  # amax subnormal: fp8_max / amax = inf
    q = (t.float() * scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return q, scale.reciprocal()


def fp8_linear_class(torch):
    """Fp8Linear: torch.nn.Linear whose forward and backward GEMMs run in FP8
    (the module docstring says how)."""
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2

    def col_major(q):
        """q [R, C] row-major as the same matrix column-major (a copy)."""
        return q.t().contiguous().t()

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            x2 = x.reshape(-1, x.shape[-1]).contiguous()  # [M, K]
            qx, sx = quantize(torch, x2, e4m3, E4M3_MAX)
            qw, sw = quantize(torch, w, e4m3, E4M3_MAX)  # [N, K]
            # y [M, N] = x [M, K] @ w.t() [K, N]: qw.t() of the row-major
            # [N, K] is column-major, as _scaled_mm wants its second operand
            y = torch._scaled_mm(qx, qw.t(), sx, sw, bias=b, out_dtype=x.dtype,
                                 use_fast_accum=True)
            ctx.save_for_backward(qx, sx, qw, sw)
            ctx.x_shape, ctx.has_bias = x.shape, b is not None
            return y.reshape(*x.shape[:-1], w.shape[0])

        @staticmethod
        def backward(ctx, gy):
            qx, sx, qw, sw = ctx.saved_tensors
            g2 = gy.reshape(-1, gy.shape[-1]).contiguous()  # [M, N]
            qg, sg = quantize(torch, g2, e5m2, E5M2_MAX)
            dx = dw = db = None
            if ctx.needs_input_grad[0]:
                # dx [M, K] = g [M, N] @ w [N, K], w column-major
                dx = torch._scaled_mm(qg, col_major(qw), sg, sw,
                                      out_dtype=gy.dtype).reshape(ctx.x_shape)
            if ctx.needs_input_grad[1]:
                # dw [N, K] = g.t() [N, M] @ x [M, K]: g.t() row-major, x column-major
                dw = torch._scaled_mm(qg.t().contiguous(), col_major(qx), sg, sx,
                                      out_dtype=gy.dtype)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                db = g2.sum(0)
            return dx, dw, db

    class Fp8Linear(torch.nn.Linear):
        def forward(self, x):
            return Fn.apply(x, self.weight, self.bias)

    return Fp8Linear


def gemm(torch, M, N, K, fp8):
    """One line of the GEMM: fp8 False (bf16), "prequantized" or RECIPE."""
    torch.manual_seed(0)
    w = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16).weight.detach()
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    e4m3 = torch.float8_e4m3fn
    if fp8 is False:
        def fn():
            return torch.matmul(x, w.t())
    elif fp8 == "prequantized":
        qx, sx = quantize(torch, x, e4m3, E4M3_MAX)
        qw, sw = quantize(torch, w, e4m3, E4M3_MAX)

        def fn():
            return torch._scaled_mm(qx, qw.t(), sx, sw, out_dtype=torch.bfloat16,
                                    use_fast_accum=True)
    else:
        def fn():
            qx, sx = quantize(torch, x, e4m3, E4M3_MAX)
            qw, sw = quantize(torch, w, e4m3, E4M3_MAX)
            return torch._scaled_mm(qx, qw.t(), sx, sw, out_dtype=torch.bfloat16,
                                    use_fast_accum=True)

    with torch.no_grad():
        for _ in range(UNTIMED):
            fn()
        eager_us = tc.time_us(torch, fn, GEMM_ITERS)
        pool = torch.cuda.graph_pool_handle()
        graph = tc.capture(torch, fn, pool=pool)
        for _ in range(UNTIMED):
            graph.replay()
        whole_us = tc.event_us(torch, graph.replay, GEMM_ITERS)
    tc.emit(tc.with_fp8({"M": M, "N": N, "K": K, "dtype": "bfloat16",
                         "eager_us": round(eager_us, 1), "whole_graph_us": round(whole_us, 1),
                         "tflops": round(2 * M * N * K / whole_us * 1e-6, 1),
                         "graph_mem_mib": round(tc.pools_mib(torch, [pool]), 2),
                         "torch": torch.__version__}, fp8, "gemm"))


def main():
    if sys.argv[1:] not in ([], ["tiny"]):
        sys.exit("usage: python3 bench/torch_fp8.py [tiny]")
    n, (L, H, B), transformer = TINY if sys.argv[1:] == ["tiny"] else FULL
    torch = tc.import_torch("torch_fp8.py")
    cc = torch.cuda.get_device_capability()
    if cc < (8, 9):
        print(f"torch_fp8.py: skipped: torch._scaled_mm needs a GPU of compute capability 8.9 or "
              f"later, and {torch.cuda.get_device_name()} has {cc[0]}.{cc[1]}", file=sys.stderr)
        return
    Fp8Linear = fp8_linear_class(torch)
    for fp8 in (False, "prequantized", RECIPE):
        gemm(torch, n, n, n, fp8)
    for fp8 in (False, RECIPE):
        tg.run(torch, L, H, B, torch.bfloat16, linear=Fp8Linear if fp8 else None, fp8=fp8)
    for fp8 in (False, RECIPE):
        tt.run(torch, *transformer, linear=Fp8Linear if fp8 else None, fp8=fp8)


if __name__ == "__main__":
    main()
