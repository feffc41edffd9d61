"""The SuperNode launcher (`python -m silofl.runtime.network.supernode`): the flwr loop it
adapts is still the one it was written for, its clock really shortens flwr's sleeps, and
the one-machine commands use it."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import time
import types

import pytest

pytest.importorskip("flwr")

from silofl.runtime.network import supernode as SN  # noqa: E402


def test_flwr_loop_is_the_one_the_launcher_adapts():
    """Pins the flwr internal: fails with a clear message when flwr's SuperNode loop changes
    (then the launcher would silently poll at Flower's 3 s, or not at all)."""
    major, minor = (int(x) for x in SN.flwr_version().split(".")[:2])
    lo, hi = SN.FLWR_TESTED
    assert lo <= (major, minor) <= hi, (
        f"flwr {SN.flwr_version()} is outside the range the SuperNode launcher was tested "
        f"against ({lo}..{hi}): re-check {SN.FLWR_LOOP_MODULE}'s idle sleep, then widen "
        f"supernode.FLWR_TESTED")
    module = importlib.import_module(SN.FLWR_LOOP_MODULE)
    src = inspect.getsource(module)
    assert SN.FLWR_IDLE_SLEEP in src, (
        f"{SN.FLWR_LOOP_MODULE} no longer contains the idle '{SN.FLWR_IDLE_SLEEP}' that "
        "silofl's SuperNode launcher shortens")
    assert "import time\n" in src and module.time is time, (
        f"{SN.FLWR_LOOP_MODULE} no longer uses a module-level `import time`")
    SN.check_flwr(module)   # and the launcher's own start-up check agrees


def test_check_flwr_refuses_a_changed_loop():
    """A loop without the idle sleep (or with another `time`) is refused, not patched."""
    fake = types.ModuleType("fake_loop")
    fake.time = time  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="plain `flower-supernode`"):
        SN.check_flwr(fake)   # no source with the idle sleep
    module = importlib.import_module(SN.FLWR_LOOP_MODULE)
    saved = module.time
    try:
        module.time = SN.PollClock(1.0)
        with pytest.raises(RuntimeError, match="no longer sleeps"):
            SN.check_flwr(module)
    finally:
        module.time = saved


def test_poll_clock_caps_every_sleep_and_keeps_the_rest_of_time():
    asked: list[float] = []
    clock = SN.PollClock(0.05, sleep=asked.append)
    clock.sleep(3)      # flwr's idle sleep
    clock.sleep(0.5)    # flwr's wait for a ClientApp reply
    clock.sleep(0.01)   # shorter sleeps are kept
    assert asked == [0.05, 0.05, 0.01]
    assert clock.time is time.time and clock.monotonic is time.monotonic


def test_install_makes_flwrs_idle_sleep_short():
    """After `install`, the very statement flwr's loop runs when idle asks the real sleep
    for the poll interval, not 3 s (recorded, not timed)."""
    module = importlib.import_module(SN.FLWR_LOOP_MODULE)
    saved = module.time
    try:
        clock = SN.install(0.05)
        assert module.time is clock
        asked: list[float] = []
        clock._sleep = asked.append
        exec(SN.FLWR_IDLE_SLEEP, vars(module))   # the loop's own line, in its namespace
        assert asked == [0.05], asked
    finally:
        module.time = saved


def test_launcher_rejects_a_bad_interval_and_passes_flower_args_on(capsys):
    with pytest.raises(SystemExit) as e:
        SN.main(["--poll-interval", "0", "--superlink", "x:1"])
    assert e.value.code == 2
    assert "between 0.01 and 60" in capsys.readouterr().err
    # the real process: flower-supernode's own argument parser answers --help
    r = subprocess.run([sys.executable, "-m", SN.__name__, "--poll-interval", "0.2",
                        "--", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--superlink" in r.stdout and "flower-supernode" in r.stdout


def test_local_commands_start_supernodes_through_the_launcher(tmp_path):
    from silofl.runtime.network import flower_app
    key = tmp_path / "keys" / "a.key"
    cfg = tmp_path / "silo_a.toml"
    cfg.write_text(f'[silo]\nprivate_key = "{key}"\n')
    cmds = flower_app.local_commands(tmp_path, {"a": str(cfg)}, 9092, node_poll=0.2)
    node = cmds["supernodes"]["a"]
    assert node[:5] == [sys.executable, "-m", "silofl.runtime.network.supernode",
                        "--poll-interval", "0.2"]
    assert "--superlink" in node and "flower-supernode" not in " ".join(node)
    default = flower_app.local_commands(tmp_path, {"a": str(cfg)}, 9092)["supernodes"]["a"]
    assert default[4] == f"{SN.DEFAULT_POLL_S:g}"
