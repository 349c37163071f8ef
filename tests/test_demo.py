"""The demo picks the machine's preset (gpu with CUDA, else cpu) and says so; --preset wins."""
import pytest
import torch

from speechperf import demo


class Stop(Exception):
    pass


@pytest.fixture
def synth_calls(monkeypatch):
    calls = []

    def fake(out, hours, seed, progress):
        calls.append(hours)
        raise Stop  # the choice is made before synthesis: nothing more to run

    monkeypatch.setattr("speechperf.corpus.synth.synthesize", fake)
    return calls


def test_pick_preset():
    assert demo.pick_preset(cuda=False) == ("cpu", "no CUDA device")


@pytest.mark.parametrize("cuda,want,hours", [(False, "cpu", 1.5), (True, "gpu", 8.0)])
def test_demo_picks_and_says_its_preset(cuda, want, hours, monkeypatch, synth_calls, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake H100")
    with pytest.raises(Stop):
        demo.run_demo(tmp_path / "d")
    out = capsys.readouterr().out
    assert f"[demo] preset {want!r} (" in out and "--preset overrides" in out
    assert ("'Fake H100' found" in out) == cuda
    assert synth_calls == [hours]


def test_preset_option_overrides_the_pick(monkeypatch, synth_calls, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(Stop):
        demo.run_demo(tmp_path / "d", preset="cpu")
    assert "preset 'cpu' (" not in capsys.readouterr().out and synth_calls == [1.5]
