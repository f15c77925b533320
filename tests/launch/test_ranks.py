"""Which rank of a job a process is, whoever launched it (gpudoctor.launch.ranks)."""

from __future__ import annotations

import pytest

from gpudoctor.launch.ranks import launched_rank

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
            "TORCHELASTIC_RUN_ID": "job7", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
SRUN = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2", "SLURM_NNODES": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x4)"}


def test_a_torchrun_worker_is_its_global_rank_on_its_node() -> None:
    found = launched_rank(TORCHRUN)
    assert found is not None and found.launcher == "torchrun"
    assert (found.rank, found.world_size, found.local_rank, found.ranks_on_node, found.node_rank) == (3, 4, 1, 2, 1)
    assert found.job == "torchrun:job7@node0:29500"


def test_an_srun_task_is_its_procid_and_the_tasks_of_its_node() -> None:
    found = launched_rank(SRUN)
    assert found is not None and found.launcher == "slurm"
    assert (found.rank, found.world_size, found.local_rank, found.ranks_on_node, found.node_rank) == (5, 8, 1, 2, 2)
    assert found.job == "slurm:4242.0"
    uneven = launched_rank({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "3(x2),1(x2)", "SLURM_NODEID": "3"})
    assert uneven is not None and uneven.ranks_on_node == 1


@pytest.mark.parametrize("env", [
    {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"},  # the batch script: no task of a step
    {**SRUN, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"},  # one task
    {"RANK": "0", "WORLD_SIZE": "1"},  # a cluster's default of one process
    {},
])
def test_a_single_process_is_no_rank(env: dict[str, str]) -> None:
    assert launched_rank(env) is None


def test_mpirun_and_a_plain_rank_and_world_size() -> None:
    mpi = launched_rank({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                         "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "prterun-x-1@1"})
    assert mpi is not None and (mpi.launcher, mpi.rank, mpi.world_size, mpi.ranks_on_node) == ("mpirun", 2, 4, 2)
    plain = launched_rank({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"})
    assert plain is not None and (plain.launcher, plain.rank, plain.ranks_on_node) == ("env", 1, 2)
    # torchrun's variables first: a torchrun job inside a Slurm allocation is torchrun's
    inside = launched_rank({**SRUN, **TORCHRUN})
    assert inside is not None and inside.launcher == "torchrun"
