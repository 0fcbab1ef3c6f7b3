"""A study's budget in GPU hours when its timed steps ran on a GPU, CPU hours as before (issue 50)."""

from __future__ import annotations

import pytest
import torch

from agentcredit.lab.preflight import budget_hours, step_unit, timed_on

GPU_STEP = {"seconds": 12.0, "device": "cuda:0", "device_name": "NVIDIA H200", "gpu_peak_gib": 3.1}
CPU_STEP = {"seconds": 1300.0, "prompts": 8, "n": 4}  # as the records before issue 50 hold them


def test_the_unit_follows_where_the_steps_ran():
    assert step_unit([CPU_STEP, CPU_STEP]) == "CPU"
    assert step_unit([GPU_STEP, {**GPU_STEP, "device": "cuda:1"}]) == "GPU"
    assert step_unit([]) == "CPU"


def test_steps_timed_on_a_cpu_and_a_gpu_make_no_budget():
    with pytest.raises(ValueError, match="both a CPU and a GPU"):
        step_unit([CPU_STEP, GPU_STEP])


def test_a_budget_reads_its_hours_in_its_unit():
    old = {
        "planned_cpu_hours": 174.0,
        "cpu_hours_to_decide": 476.0,
    }  # a preflight.json written before issue 50
    assert budget_hours(old) == ("CPU", 174.0, 476.0)
    gpu = {"unit": "GPU", "planned_gpu_hours": 1.5, "gpu_hours_to_decide": None}
    assert budget_hours(gpu) == ("GPU", 1.5, None)


def test_a_step_timed_on_the_cpu_records_nothing_new():
    assert timed_on(torch.device("cpu")) == {}
