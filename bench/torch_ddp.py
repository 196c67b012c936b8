"""PyTorch's side of bench/bench_dist.lua: DistributedDataParallel on the
same model and step, so that the data-parallel lines of both come from one
run. L x (Linear(H, H) + GELU), batch B per rank, forward and backward of
the mean square error against a fixed target, SGD (lr 1e-3) with
zero_grad(set_to_none=True), as bench_dist.lua's trainer. Configurations:

- torch_local_eager / torch_local_whole: no DDP, eagerly, and the whole
  step captured as one torch.cuda.graph (warmed up on a side stream);
- torch_ddp_eager / torch_ddp_whole: the model in DDP (NCCL, buckets of
  25 MB, gradient_as_bucket_view), eagerly, and the whole step, all-reduces
  included, as one graph.

Efficiency is the local step of the same mode over the DDP step, as
bench_dist.lua reports it. One JSON line per configuration and dtype.

Usage (one GPU per rank; the rank and world size come from Open MPI's
environment, else 0 and 1):
  mpirun -np 1 python3 bench/torch_ddp.py [L H B ITERS]
Capturing a DDP step whole takes what PyTorch's CUDA graphs notes list:
TORCH_NCCL_ASYNC_ERROR_HANDLING=0 (set before torch is loaded), DDP made
on a side stream, and 11 eager steps before the capture (its buckets are
rebuilt after the first). Times are rank 0's (bench_dist.lua reports the
ranks' max; the same at world size 1).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

UNTIMED = 3
DDP_WARMUP = 11  # eager DDP steps before a capture, as PyTorch's CUDA graphs notes ask


def main():
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    args = [int(a) for a in sys.argv[1:5]]
    L, H, B, iters = args + [4, 256, 32, 20][len(args):]  # bench_dist.lua's defaults
    local_rank = rank % torch.cuda.device_count()
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", local_rank))

    def line(name, dtype, us, baseline, base_us):
        if rank == 0:
            print(json.dumps({"config": name, "world_size": world, "device": "cuda",
                              "framework": "torch", "dtype": dtype, "L": L, "H": H, "B": B,
                              "step_us": round(us, 1), "baseline": baseline,
                              "efficiency": round(base_us / us, 3)}), flush=True)

    for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        torch.manual_seed(1)
        x = torch.randn(B, H, device="cuda", dtype=dtype)
        y = torch.randn(B, H, device="cuda", dtype=dtype)

        def trainer(model):
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)

            def step():
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            return step

        def eager_us(step):
            for _ in range(UNTIMED):
                step()
            dist.barrier()
            return tc.time_us(torch, step, iters)

        def whole_us(step, ddp):
            for _ in range(DDP_WARMUP if ddp else 0):
                step()
            graph = tc.capture(torch, step)
            dist.barrier()
            return tc.time_us(torch, graph.replay, iters)

        def model(ddp):
            torch.manual_seed(1)
            m = torch.nn.Sequential(*tc.stack(torch, L, H, dtype))
            if not ddp:
                return m
            side = torch.cuda.Stream()  # PyTorch's notes: DDP made on a side stream
            with torch.cuda.stream(side):
                d = DDP(m, device_ids=[local_rank], bucket_cap_mb=25,
                        gradient_as_bucket_view=True)
            torch.cuda.current_stream().wait_stream(side)
            return d

        base_eager = eager_us(trainer(model(False)))
        line("torch_local_eager", name, base_eager, "torch_local_eager", base_eager)
        base_whole = whole_us(trainer(model(False)), False)
        line("torch_local_whole", name, base_whole, "torch_local_whole", base_whole)
        line("torch_ddp_eager", name, eager_us(trainer(model(True))), "torch_local_eager",
             base_eager)
        line("torch_ddp_whole", name, whole_us(trainer(model(True)), True), "torch_local_whole",
             base_whole)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
