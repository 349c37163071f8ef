"""One rule names a machine from its recorded environment: labels, platform descriptions and
price matching all read it, with its two GPU counts (used, paid for) side by side."""
import pytest

from speechperf.hardware import machine as M

EPYC = {"cpu_model": "AMD EPYC 9454 48-Core Processor", "cpu_cores_logical": 96, "memory_gb": 755.5}
H100 = {"name": "NVIDIA H100 80GB HBM3"}


@pytest.mark.parametrize("env, used, paid, name, words", [
    ({**EPYC, "device": "cpu", "gpus": []}, 0, 0, "96-core EPYC", "AMD EPYC 9454 48-Core Processor"),
    # a CPU run on a GPU machine: computed on no GPU, paid for the machine's one
    ({**EPYC, "device": "cpu", "gpus": [H100]}, 0, 1, "96-core EPYC", "1x NVIDIA H100 80GB HBM3"),
    # 4 processes on a rented 8-GPU machine: 4 used, 8 paid for
    ({**EPYC, "device": "cuda:0", "world_size": 4, "gpus": [H100] * 8}, 4, 8, "H100x4", "8x NVIDIA H100 80GB HBM3"),
    # two 8-GPU machines under torchrun: rank 0 recorded its own 8, the world is 16
    ({**EPYC, "device": "cuda:0", "world_size": 16, "gpus": [H100] * 8}, 16, 16, "H100x16", "8x NVIDIA H100 80GB HBM3"),
    ({"cpu_model": "Intel(R) Xeon(R) CPU @ 2.20GHz", "cpu_affinity": 2, "cpu_cores_logical": 4, "gpus": []},
     0, 0, "2-core Xeon", "Intel(R) Xeon(R) CPU @ 2.20GHz"),
])
def test_gpu_counts_and_names(env, used, paid, name, words):
    assert M.gpus_used(env) == used and M.gpu_count(env)[0] == paid
    assert (M.gpu_count(env)[1] is not None) == (env.get("world_size", 1) > len(env["gpus"]) > 0)
    assert M.machine_name(env) == name and M.hardware(env) == words


def test_every_reader_uses_the_one_rule():
    from speechperf.results import labels
    from speechperf.hardware import platforms

    assert labels.machine_name is M.machine_name and platforms.hardware is M.hardware and platforms.gpu_count is M.gpu_count
    env = {**EPYC, "device": "cuda:0", "world_size": 1, "gpus": [H100] * 2}
    p = platforms.describe(env)
    assert (p.name, p.gpus) == ("2x NVIDIA H100 80GB HBM3 / AMD EPYC 9454 48-Core Processor", 2)
    assert p.devices == "2x NVIDIA H100 80GB HBM3, AMD EPYC 9454 48-Core Processor (96 logical cores), 755.5 GB"
    assert labels.default_label(env, {"preset": "paper", "train": {"system": {"precision": "bf16"}}}) == "H100x1 paper bf16"


def test_instance_type_only_from_ec2():
    ec2 = {"cpu_model": "Intel Xeon", "gpus": [], "cloud_instance": {"vendor": "Amazon EC2", "product": "m7i.xlarge"}}
    assert M.instance_type(ec2) == "m7i.xlarge" and M.hardware(ec2) == "Intel Xeon (Amazon EC2 m7i.xlarge)"
    assert M.instance_type({**ec2, "cloud_instance": {"vendor": "QEMU", "product": "m7i.xlarge"}}) is None
