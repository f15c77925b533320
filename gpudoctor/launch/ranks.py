"""Which rank of a job this process is, whoever launched it: each rank writes its own bundle, `rank-K/`, named by
its global rank, and records the node it ran on.

A job's launcher tells its processes who they are through their environment:
- torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node), TORCHELASTIC_RUN_ID;
- Slurm's `srun`: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_ID and SLURM_STEP_ID (a task
  of a job step, not the batch script that starts it);
- Open MPI's `mpirun`: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; MPICH and Intel MPI: PMI_RANK,
  PMI_SIZE;
- another launcher, or a cluster's: RANK and WORLD_SIZE.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchedRank:
    """This process's place in its job. `job`: what every rank of the job on every node shares (the launcher's
    run id and rendezvous address), so that ranks of one job are told from an earlier job's in the same directory."""

    launcher: str  # torchrun | slurm | mpirun | env
    rank: int
    world_size: int
    local_rank: int | None
    local_world_size: int | None
    node_rank: int | None
    job: str

    @property
    def host(self) -> str:
        return socket.gethostname()

    @property
    def ranks_on_node(self) -> int:
        return self.local_world_size or self.world_size


def launched_rank(env: Mapping[str, str] | None = None) -> LaunchedRank | None:
    """This process's rank when a launcher started it as one rank of several, else None."""
    env = os.environ if env is None else env
    for read in (_torchrun, _slurm, _mpirun, _plain):
        found = read(env)
        if found is not None:
            return found
    return None


def torchrun_rank() -> int | None:
    """This process's global rank when a launcher started it as a rank of a job, else None (kept by name: torchrun's
    was the first launcher known)."""
    found = launched_rank()
    return found.rank if found is not None else None


def _int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def _valid(rank: int | None, world: int | None) -> bool:
    return rank is not None and world is not None and 0 <= rank < world


def _torchrun(env: Mapping[str, str]) -> LaunchedRank | None:
    """A job of one rank is still a torchrun job: torchrun's agent sets TORCHELASTIC_RUN_ID for its workers, and
    `gpudoctor profile torchrun --nproc_per_node 1 ...` merges the rank's bundle from rank-0/ as it would several."""
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if not _valid(rank, world) or "TORCHELASTIC_RUN_ID" not in env:
        return None
    assert rank is not None and world is not None
    job = f"torchrun:{env['TORCHELASTIC_RUN_ID']}@{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    return LaunchedRank("torchrun", rank, world, _int(env, "LOCAL_RANK"), _int(env, "LOCAL_WORLD_SIZE"),
                        _int(env, "GROUP_RANK"), job)


def _slurm(env: Mapping[str, str]) -> LaunchedRank | None:
    rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
    if not _valid(rank, world) or (world or 0) < 2 or "SLURM_STEP_ID" not in env:
        return None
    assert rank is not None and world is not None
    nodes = _int(env, "SLURM_STEP_NUM_NODES") or _int(env, "SLURM_NNODES")
    local = _tasks_on_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE"),
                           _int(env, "SLURM_NODEID"))
    if local is None and nodes:
        local = world // nodes if world % nodes == 0 else None
    job = f"slurm:{env.get('SLURM_JOB_ID', '')}.{env['SLURM_STEP_ID']}"
    return LaunchedRank("slurm", rank, world, _int(env, "SLURM_LOCALID"), local, _int(env, "SLURM_NODEID"), job)


def _tasks_on_node(spec: str | None, node: int | None) -> int | None:
    """Slurm's tasks per node, "2(x3),1" (two on each of the first three nodes, then one), for node `node`."""
    if not spec or node is None:
        return None
    index = 0
    for part in spec.split(","):
        count, _, times = part.partition("(x")
        try:
            tasks, repeat = int(count), int(times.rstrip(")")) if times else 1
        except ValueError:
            return None
        if node < index + repeat:
            return tasks
        index += repeat
    return None


def _mpirun(env: Mapping[str, str]) -> LaunchedRank | None:
    rank, world = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
    if _valid(rank, world) and (world or 0) > 1:
        assert rank is not None and world is not None
        job = f"mpirun:{env.get('OMPI_MCA_ess_base_jobid', '')}{env.get('PMIX_NAMESPACE', '')}"
        return LaunchedRank("mpirun", rank, world, _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
                            _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"), None, job)
    rank, world = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
    if _valid(rank, world) and (world or 0) > 1:
        assert rank is not None and world is not None
        return LaunchedRank("mpirun", rank, world, _int(env, "MPI_LOCALRANKID"), _int(env, "MPI_LOCALNRANKS"), None,
                            f"mpirun:{env.get('PMI_KVSNAME', '')}{env.get('PMIX_NAMESPACE', '')}")
    return None


def _plain(env: Mapping[str, str]) -> LaunchedRank | None:
    """RANK and WORLD_SIZE from another launcher; RANK=0 with WORLD_SIZE=1 (a cluster's default) is a single
    process."""
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if not _valid(rank, world) or (world or 0) < 2:
        return None
    assert rank is not None and world is not None
    return LaunchedRank("env", rank, world, _int(env, "LOCAL_RANK"), _int(env, "LOCAL_WORLD_SIZE"),
                        _int(env, "NODE_RANK") if "NODE_RANK" in env else _int(env, "GROUP_RANK"),
                        f"env:{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}")
