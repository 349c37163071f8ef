"""Platform profiles: every shipped file valid and dated, selection from recorded environments,
override precedence, and the price/performance arithmetic."""
import itertools
import json

import pytest

from speechperf.cli import main
from speechperf.config import ConfigError, platform_names
from speechperf.hardware import platforms as P

GPU_PROFILES = {"h100-sxm", "h100-pcie", "h200", "a100-40gb-sxm", "a100-80gb-sxm", "a100-80gb-pcie", "l40s", "l4",
                "rtx-4090", "mi300x", "mi325x", "mi355x"}


def env(gpu: str | None = None, n: int = 1, **extra) -> dict:
    """A recorded environment as capture_env writes it (only the keys platforms read)."""
    gpus = [{"index": i, "name": gpu, "memory_gb": 80.0} for i in range(n)] if gpu else []
    return {"cpu_model": "Test CPU 9000", "cpu_cores_logical": 8, "memory_gb": 64.0, "gpus": gpus, "platform": None,
            **extra}


@pytest.mark.parametrize("name", platform_names())
def test_every_profile_is_valid_dated_and_sourced(name):
    raw = __import__("speechperf.config", fromlist=["load_platform"]).load_platform(name)["platform"]
    p = P.load(name)  # parses and validates
    assert p.source == "preset"
    for key in P.PRICE_KEYS:
        assert raw.get(key) is None or raw[key] >= 0
    if any(raw.get(k) is not None for k in P.PURCHASE_KEYS):
        assert P.DATE.match(raw["price_date"]) and raw["price_source"].strip()
    if raw.get("usd_per_hour") is not None:
        assert P.DATE.match(raw["hourly_date"]) and raw["hourly_source"].strip()
    if raw.get("per_gpu"):
        assert raw["gpu_names"] and raw["gpus"] == 1
    if not p.priced:  # a profile without any price says why
        assert p.note and "price" in p.note


def test_the_machines_people_rent_and_buy_today_are_there():
    names = set(platform_names())
    assert GPU_PROFILES | {"sys1", "sys2", "sys10"} <= names
    assert {p.key for p in P.profiles() if p.instance_types and not p.gpu_names}  # CPU-only cloud instances
    for key in GPU_PROFILES:
        assert P.load(key).gpu_names, key


def test_no_two_profiles_match_the_same_gpu_model_and_count():
    for a, b in itertools.combinations(P.profiles(), 2):
        shared = {P._norm(n) for n in a.gpu_names} & {P._norm(n) for n in b.gpu_names}
        assert not (shared and a.per_gpu and b.per_gpu), (a.key, b.key, shared)
        assert not (shared and not a.per_gpu and not b.per_gpu and a.gpus == b.gpus), (a.key, b.key, shared)
        assert not set(a.instance_types) & set(b.instance_types), (a.key, b.key)
    for p in P.profiles():  # every GPU name a profile lists selects exactly that profile
        for name in p.gpu_names:
            assert [m.key for m in P.match(env(name, p.gpus or 1))] == [p.key]


@pytest.mark.parametrize("gpu,n,key,rate", [
    ("NVIDIA H100 80GB HBM3", 1, "h100-sxm", 3.99),
    ("NVIDIA H100 PCIe", 1, "h100-pcie", 2.89),
    ("NVIDIA H200", 8, "h200", 8 * 4.59),
    ("NVIDIA A100-SXM4-40GB", 1, "a100-40gb-sxm", 1.99),
    ("NVIDIA A100-SXM4-80GB", 4, "a100-80gb-sxm", 4 * 1.79),
    ("NVIDIA A100 80GB PCIe", 1, "a100-80gb-pcie", 1.79),
    ("NVIDIA L4", 2, "l4", 2 * 0.7992),
    ("AMD Instinct MI300X", 1, "mi300x", 2.59),
    ("AMD Instinct MI325X", 8, "mi325x", 8 * 1.95),
])
def test_the_environment_picks_the_profile_and_the_count_scales_it(gpu, n, key, rate):
    p = P.of_run(env(gpu, n))
    assert p.key == key and p.gpus == n and p.usd_per_hour == pytest.approx(rate)
    assert p.source == f"detected ({key})" and p.hourly_date and p.hourly_source
    assert p.name.startswith(f"{n}x ") == (n > 1)


def test_a_run_across_machines_is_priced_for_all_its_gpus():
    p = P.of_run({**env("NVIDIA H100 80GB HBM3", 8), "world_size": 16})  # two 8-GPU nodes under torchrun
    assert p.gpus == 16 and p.usd_per_hour == pytest.approx(16 * 3.99) and "world_size 16" in p.note
    assert P.of_run({**env("NVIDIA H100 80GB HBM3", 8), "world_size": 4}).gpus == 8  # 4 of 8 rented GPUs: pay 8


def test_gpu_purchase_price_scales_and_prices_tta():
    p = P.of_run(env("NVIDIA H100 80GB HBM3", 2))
    assert (p.price_gpus_usd, p.price_usd, p.usd_per_hour) == (50000.0, None, 7.98)
    row = P.price_performance(30.0, p)
    assert row["TTA x price ($ min)"] == 30.0 * 50000.0 and row["cost to accuracy $"] == pytest.approx(0.5 * 7.98)
    assert "host not priced" in row["price note"]


@pytest.mark.parametrize("e", [
    env("NVIDIA H100 NVL", 1),  # a variant no profile prices: never priced as the PCIe card
    env("NVIDIA GeForce RTX 5090", 1),
    {**env("NVIDIA L4", 1), "gpus": [{"name": "NVIDIA L4"}, {"name": "NVIDIA L40S"}]},  # mixed models
    env(),  # CPU only, no instance type recorded: a CPU model does not identify a cloud instance
    env(cloud_instance={"vendor": "Google", "product": "Google Compute Engine"}),
    env(cloud_instance={"vendor": "Amazon EC2", "product": "m7i.48xlarge"}),
])
def test_unknown_hardware_gets_no_price_and_says_what_to_give(e):
    p = P.of_run(e)
    assert not p.priced and p.key == "detected"
    assert p.note == f"no price for {P.hardware(e)}; give --price-per-hour"
    row = P.price_performance(12.0, p)
    assert row["cost to accuracy $"] is None and row["TTA x price ($ min)"] is None
    assert f"no price for {P.hardware(e)}; give --price-per-hour" in row["price note"]


def test_unknown_gpu_message_names_model_and_count():
    assert P.of_run(env("NVIDIA B300", 2)).note == "no price for 2x NVIDIA B300; give --price-per-hour"


def test_cpu_only_run_on_a_recorded_ec2_instance_type():
    p = P.of_run(env(cloud_instance={"vendor": "Amazon EC2", "product": "m7i.xlarge"}))
    assert (p.key, p.usd_per_hour, p.hourly_date) == ("aws-m7i-xlarge", 0.2016, "2026-04")
    # the same product name from another vendor is not an EC2 instance
    assert not P.of_run(env(cloud_instance={"vendor": "QEMU", "product": "m7i.xlarge"})).priced


def test_a_cpu_run_matches_a_cpu_profile_by_its_model_per_vcpu_as_a_gpu_run_by_its_gpus():
    e = env(cpu_model="Intel(R) Xeon(R) Platinum 8488C", cpu_cores_logical=2)
    p = P.of_run(e)
    assert p.source == "detected (aws-m7i-xlarge)" and p.usd_per_hour == pytest.approx(0.2016 * 2 / 4)
    assert p.name == "2 vCPU of AWS m7i.xlarge" and p.hourly_date == "2026-04"
    assert p.note.startswith("2/4 of the AWS m7i.xlarge rate: matched by its CPU model (Intel(R) Xeon(R) Platinum "
                             "8488C), priced per vCPU") and "c7i and r7i" in p.note
    row = P.price_columns(e, 60.0)
    assert row["cost to accuracy $"] == pytest.approx(0.1008) and row["platform"] == "2 vCPU of AWS m7i.xlarge"
    whole = P.of_run({**e, "cloud_instance": {"vendor": "Amazon EC2", "product": "m7i.xlarge"}})
    assert whole.usd_per_hour == 0.2016  # the instance type recorded: the whole instance's rate
    amd = P.of_run(env(cpu_model="AMD EPYC 9R14", cpu_cores_logical=2))  # identified, no dated rate: says so
    assert amd.source == "detected (aws-m7a-xlarge)" and not amd.priced and "--price-per-hour" in amd.note
    assert not P.of_run(env(cpu_model="AMD EPYC", cpu_cores_logical=2)).priced  # a CPU model many machines have


def test_cpu_names_need_vcpus(tmp_path):
    f = tmp_path / "x.toml"
    f.write_text('[platform]\nname = "x"\ndevices = "a CPU"\ncpu_names = ["Some CPU"]\n')
    with pytest.raises(ConfigError, match="cpu_names needs vcpus"):
        P.load(str(f))


def test_cloud_instance_reads_dmi(tmp_path):
    from speechperf.hardware.environment import cloud_instance

    assert cloud_instance(str(tmp_path / "none")) is None
    (tmp_path / "sys_vendor").write_text("Amazon EC2\n")
    (tmp_path / "product_name").write_text("c7i.2xlarge\n")
    assert cloud_instance(str(tmp_path)) == {"vendor": "Amazon EC2", "product": "c7i.2xlarge"}


def test_override_precedence(tmp_path):
    user = tmp_path / "mine.toml"
    user.write_text('[platform]\nname = "my box"\ndevices = "1x H100"\nusd_per_hour = 1.25\nprice_date = "2026-11"\n')
    per_gpu = tmp_path / "pergpu.toml"
    per_gpu.write_text('[platform]\nname = "rented L4"\ndevices = "L4"\ngpus = 1\nper_gpu = true\n'
                       'gpu_names = ["NVIDIA L4"]\nusd_per_hour = 0.5\nhourly_date = "2026-11-20"\n'
                       'hourly_source = "my invoice"\n')
    detected = env("NVIDIA H100 80GB HBM3", 1)
    named = {**detected, "platform": "sys1"}
    assert P.of_run(detected).usd_per_hour == 3.99  # detected
    assert P.of_run(named).key == "sys1" and P.of_run(named).usd_per_hour is None  # named > detected
    p = P.of_run(P.with_price_overrides(named, platform_file=user))  # file > named
    assert (p.name, p.usd_per_hour, p.hourly_date, p.hourly_source) == ("my box", 1.25, "2026-11", f"user file {user}")
    p = P.of_run(P.with_price_overrides(named, price_per_hour=7.5, platform_file=user))  # --price-per-hour > file
    assert (p.name, p.usd_per_hour, p.hourly_source) == ("my box", 7.5, "--price-per-hour")
    p = P.of_run(P.with_price_overrides(detected, price_per_hour=7.5))  # --price-per-hour > detected
    assert (p.key, p.usd_per_hour, p.price_gpus_usd) == ("h100-sxm", 7.5, 25000.0)
    p = P.of_run(P.with_price_overrides(env("NVIDIA B300", 1), price_per_hour=2.0))  # prices unknown hardware
    assert p.usd_per_hour == 2.0 and "no price" not in p.note
    p = P.of_run(P.with_price_overrides(env("NVIDIA L4", 3), platform_file=per_gpu))  # a per-GPU user file scales
    assert (p.name, p.usd_per_hour) == ("3x rented L4", 1.5)
    assert P.with_price_overrides(detected) is detected


def test_bad_overrides_and_moved_named_files_say_so(tmp_path):
    with pytest.raises(ConfigError, match="price-per-hour"):
        P.with_price_overrides(env(), price_per_hour=-1.0)
    with pytest.raises(ConfigError, match="unknown platform"):
        P.with_price_overrides(env(), platform_file=tmp_path / "missing.toml")
    p = P.of_run({**env("NVIDIA L4", 1), "platform": str(tmp_path / "gone.toml")})  # moved since training
    assert p.key == "l4" and "does not load" in p.note


@pytest.mark.parametrize("body,match", [
    ('usd_per_hour = 1.0\n', "no hourly_date"),
    ('usd_per_hour = -1.0\nhourly_date = "2026"\n', "non-negative"),
    ('usd_per_hour = 1.0\nhourly_date = "last week"\n', "YYYY"),
    ('price_usd = 9.0\n', "no price_date"),
    ('per_gpu = true\ngpus = 1\n', "gpu_names"),
    ('per_gpu = true\ngpus = 2\ngpu_names = ["X"]\n', "gpus must be 1"),
    ('gpu_names = "NVIDIA L4"\n', "list of non-empty strings"),
    ('colour = "green"\n', "unknown keys"),
    ('peak_tflops_bf16 = 100.0\n', "peak_date"),
    ('peak_tflops_bf16 = -1.0\npeak_date = "2026"\n', "non-negative"),
])
def test_bad_user_files_name_the_problem(tmp_path, body, match):
    f = tmp_path / "bad.toml"
    f.write_text('[platform]\nname = "x"\ndevices = "y"\n' + body)
    with pytest.raises(ConfigError, match=match):
        P.load(str(f))


def test_a_shipped_profile_needs_a_source(tmp_path, monkeypatch):
    monkeypatch.setattr("speechperf.config.PLATFORM_DIR", tmp_path)
    (tmp_path / "nosrc.toml").write_text('[platform]\nname = "x"\ndevices = "y"\nusd_per_hour = 1.0\n'
                                         'hourly_date = "2026-11"\n')
    with pytest.raises(ConfigError, match="no hourly_source"):
        P.load("nosrc")


def test_amd_instinct_runs_are_matched_to_their_profiles_and_peaks():
    """ROCm's torch names the GPU by its marketing name; the MI355X has no tf32 peak (CDNA 4 has
    no TF32 unit) and no dated price: it is matched, and says what is missing."""
    p = P.of_run(env("AMD Instinct MI355X", 8))
    assert p.key == "mi355x" and p.gpus == 8 and not p.priced and "no dated hourly" in p.note
    assert P.price_performance(12.0, p)["cost to accuracy $"] is None
    assert P.gpu_peak_tflops("AMD Instinct MI355X", "bf16")[0] == 2516.6
    assert P.gpu_peak_tflops("AMD Instinct MI355X", "tf32") == (None, "platform profile 'mi355x' has no dense tf32 peak")
    assert P.gpu_peak_tflops("AMD Instinct MI325X", "bf16")[0] == P.gpu_peak_tflops("AMD Instinct MI300X", "bf16")[0]


def test_gpu_profiles_carry_dated_dense_peaks(tmp_path, monkeypatch):
    for name in GPU_PROFILES:
        p = P.load(name)
        assert p.peak_tflops_bf16 and p.peak_tflops_fp32 and p.peak_date and p.peak_source, name
        assert p.peak_tflops_bf16 > p.peak_tflops_fp32, name  # tensor cores
    assert P.gpu_peak_tflops("NVIDIA H100 80GB HBM3", "bf16")[0] == 989.5
    assert P.gpu_peak_tflops("Some GPU", "bf16") is None
    monkeypatch.setattr("speechperf.config.PLATFORM_DIR", tmp_path)
    (tmp_path / "nosrc.toml").write_text('[platform]\nname = "x"\ndevices = "y"\npeak_tflops_fp32 = 1.0\n'
                                         'peak_date = "2026-11"\n')
    with pytest.raises(ConfigError, match="no peak_source"):
        P.load("nosrc")


def test_price_performance_arithmetic_is_exact():
    p = P.Platform(key="k", name="m", devices="d", price_usd=1000.0, usd_per_hour=6.0)
    row = P.price_performance(30.0, p, energy_j=7.2e6)
    assert row == {"TTA min": 30.0, "TTA x price ($ min)": 30000.0, "cost to accuracy $": 3.0,
                   "energy to accuracy kWh": 2.0, "price note": None}
    row = P.price_performance(None, p, energy_j=7.2e6)  # never reached: NA, and the note says why
    assert row["cost to accuracy $"] is None and row["energy to accuracy kWh"] is None
    assert row["price note"] == "target not reached"
    row = P.price_performance(90.0, P.Platform(key="k", name="m", devices="d", usd_per_hour=2.0))
    assert row["cost to accuracy $"] == 3.0 and row["TTA x price ($ min)"] is None
    assert row["price note"] == "no purchase price for m; no energy counter or power samples"


def test_price_columns_of_a_run():
    row = P.price_columns(env("NVIDIA L4", 2), 60.0, energy_j=3.6e6)
    assert row["platform"] == "2x NVIDIA L4 24 GB" and row["$/hour"] == pytest.approx(1.5984)
    assert row["cost to accuracy $"] == pytest.approx(1.5984) and row["energy to accuracy kWh"] == 1.0


def test_platforms_command_lists_every_profile_with_dates_and_sources(capsys, tmp_path):
    user = tmp_path / "mine.toml"
    user.write_text('[platform]\nname = "my box"\ndevices = "d"\nusd_per_hour = 1.25\nprice_date = "2026-11"\n')
    assert main(["platforms", "--json", "--file", str(user)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["profile"] for r in rows] == platform_names() + [str(user)]
    for r in rows:
        if r["$/hour"] is not None:
            assert r["hourly date"] and r["hourly source"]
        if r["purchase $"] is not None:
            assert r["price date"] and r["price source"]
    h100 = next(r for r in rows if r["profile"] == "h100-sxm")
    assert (h100["per"], h100["$/hour"], h100["matches"]) == ("GPU", 3.99, "NVIDIA H100 80GB HBM3")
    assert main(["platforms"]) == 0 and "h100-sxm" in capsys.readouterr().out
