"""Joining a torchrun job: which process this is, and the device it works on.

Under ``torchrun`` (``WORLD_SIZE`` > 1) a process joins the default process group, NCCL when it works on a GPU and
gloo on the CPU, and a CUDA process takes the GPU of its ``LOCAL_RANK``. Run plainly, nothing is joined. A run
that joined the group leaves it when it returns (`leaves_process_group`).
"""
from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vocab.errors import ElmoError


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def launched_world_size() -> int:
    """How many processes torchrun started (1 when run plainly), readable before the process group is joined."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(device: torch.device) -> tuple[Dist, torch.device]:
    """This process's place in a torchrun job (or a single process) and the device it should use."""
    world = launched_world_size()
    if world <= 1:
        return Dist(), device
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        per_node = max(local + 1, int(os.environ.get("LOCAL_WORLD_SIZE", "0")))  # torchrun sets it
        if per_node > torch.cuda.device_count():  # every process stops here, before joining NCCL
            raise ElmoError(f"torchrun started {per_node} processes on this machine, but torch sees "
                            f"{torch.cuda.device_count()} GPU(s): start at most that many processes per node "
                            f"(torchrun's nproc-per-node), or --device cpu for gloo on the CPU")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, local), device


@contextlib.contextmanager
def leaves_process_group():
    """Around a run (or as its decorator) that may join torchrun's process group: when it returns, the group it
    joined is left (`leave_process_group`). A group joined before it, by the caller, is left to the caller. A run
    that raises leaves the group up: its process is failing, and another may still wait in a collective."""
    ours = dist.is_available() and not dist.is_initialized()  # a torch built without it joins nothing
    yield
    if ours and dist.is_initialized():
        leave_process_group()


def leave_process_group() -> None:
    """Wait for every process, then destroy the default process group, once nothing of the run holds it.

    Why: a process that exits with the group still up, or with a DistributedDataParallel model alive after the
    group was destroyed (its reducer holds the group), can abort at exit in gloo's threads ("terminate called
    without an active exception", SIGABRT) after its work is done, and torchrun then reports the job failed
    (`benchmarks.bench_teardown`: of 120 two-process jobs, 1 aborted without leaving and 3 with the model alive,
    none as here). The run's trainer is garbage in reference cycles by now, so it is collected first."""
    gc.collect()
    if dist.get_backend() == "nccl":  # the GPU this process took (init_distributed), not one NCCL would guess
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()
    dist.destroy_process_group()


def is_main_process() -> bool:
    """False only in a torchrun process of rank > 0 (readable before the process group is joined): the one
    process that prints and writes."""
    return int(os.environ.get("RANK", "0")) == 0


def all_gather_rows(ids: torch.Tensor, grads: torch.Tensor, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every process's gathered softmax rows and their gradients, in rank order, the gradients averaged over the
    processes as DistributedDataParallel averages the dense ones.

    Why not DDP: DDP all-reduces a gradient the size of the whole softmax (it cannot take a sparse one), a
    vocabulary x projection matrix every step, where a step touches only its targets' and negatives' rows. These are
    of a fixed size on every process (the batch's targets and the sampled negatives), so one all-gather of each
    tensor moves them with nothing for the host to wait on.

    # Parameters
    ids : `(M,)` int64 the rows this process gathered; grads : `(M, ...)` their gradients.

    # Returns
    `(world_size * M,)` ids and `(world_size * M, ...)` gradients divided by `world_size`.
    """
    ids_out = [torch.empty_like(ids) for _ in range(world_size)]
    grads_out = [torch.empty_like(grads) for _ in range(world_size)]
    dist.all_gather(ids_out, ids.contiguous())
    dist.all_gather(grads_out, grads.contiguous())
    return torch.cat(ids_out), torch.cat(grads_out).div_(world_size)
