"""packaging/install.sh argument handling (dry runs only: nothing is installed), big-core
detection against sample /sys trees, and the warm-up API's small pieces."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from merlin.engine import cpu
from merlin.engine.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "packaging" / "install.sh"

DEBIAN_12 = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'
UBUNTU_24 = 'PRETTY_NAME="Ubuntu 24.04 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n'
ARMBIAN = 'PRETTY_NAME="Armbian 24.5 bookworm"\nID=debian\nVERSION_ID="12"\n'
FEDORA = 'PRETTY_NAME="Fedora Linux 40"\nID=fedora\nVERSION_ID=40\n'
DEBIAN_11 = 'PRETTY_NAME="Debian GNU/Linux 11 (bullseye)"\nID=debian\nVERSION_ID="11"\n'
UBUNTU_20 = 'PRETTY_NAME="Ubuntu 20.04 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="20.04"\n'

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def install(tmp_path, *args, os_release=DEBIAN_12, arch="aarch64"):
    release = tmp_path / "os-release"
    release.write_text(os_release)
    env = dict(os.environ, MERLIN_OS_RELEASE=str(release), MERLIN_ARCH=arch)
    return subprocess.run(
        ["bash", str(INSTALL), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


# ---------------------------------------------------------------------------- install.sh


def test_help(tmp_path):
    r = install(tmp_path, "--help")
    assert r.returncode == 0
    for word in ("Usage:", "--kiosk", "--uninstall", "--dry-run", "--user", "--weights"):
        assert word in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--frobnicate"], "unknown option '--frobnicate'"),
        (["--kiosk=x11"], "unknown kiosk mode 'x11'"),
        (["--weights", "q5"], "--weights must be"),
        (["--kv", "q4"], "--kv must be"),
        (["--weights"], "--weights needs a value"),
        (["--user", "--dry-run"], "--user needs a value"),
        (["--purge"], "--purge only goes with --uninstall"),
        (["--uninstall", "--kiosk"], "do not go together"),
        (["--prefix", "relative/dir"], "must be an absolute path"),
        (["--prefix", "/usr"], "too broad"),
        (["--prefix", "/opt/"], "too broad"),  # an uninstall would have removed all of /opt
        (["--prefix", "//opt/."], "too broad"),
    ],
)
def test_bad_arguments(tmp_path, args, message):
    r = install(tmp_path, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert "would run" not in r.stdout  # stopped before doing anything


def test_dry_run_installs_nothing_and_says_what_it_would_do(tmp_path):
    prefix = tmp_path / "opt-merlin"
    r = install(tmp_path, "--dry-run", "--prefix", str(prefix), "--weights", "q8,q4", "--kv", "all")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "dry run: nothing is changed" in out
    assert f"-m venv {prefix}/venv" in out
    assert f"-e {prefix}/src[app]" in out
    assert f"ln -sfn {prefix}/venv/bin/merlin /usr/local/bin/merlin" in out
    assert "would write /usr/share/applications/merlin.desktop" in out
    assert "Exec=/usr/local/bin/merlin" in out
    assert "merlin --warmup --weights q8,q4 --kv all" in out
    assert "merlin-kiosk" not in out  # no kiosk unless asked
    assert not prefix.exists()


def test_dry_run_on_ubuntu_x86(tmp_path):
    r = install(tmp_path, "--dry-run", "--no-warmup", os_release=UBUNTU_24, arch="x86_64")
    assert r.returncode == 0, r.stderr
    assert "Ubuntu 24.04 LTS (x86_64)" in r.stdout
    assert "warm-up skipped" in r.stdout
    assert "--warmup" not in r.stdout.replace("--no-warmup", "")


def test_aarch64_glibc_pin_is_written_for_old_glibc_only(tmp_path):
    r = install(tmp_path, "--dry-run", os_release=ARMBIAN, arch="aarch64")
    assert r.returncode == 0, r.stderr
    assert "PySide6-Essentials!=6.12.0" in r.stdout
    import platform

    glibc = tuple(int(x) for x in platform.libc_ver()[1].split(".")[:2] or (0, 0))
    assert ("PySide6-Essentials<=6.8.0.2" in r.stdout) == (glibc < (2, 39))
    r = install(tmp_path, "--dry-run", os_release=ARMBIAN, arch="x86_64")
    assert "PySide6-Essentials<=6.8.0.2" not in r.stdout


def test_kiosk_cage_unit(tmp_path):
    r = install(tmp_path, "--dry-run", "--kiosk=cage", "--user", "kiosk")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "cage" in out.split("would run: env DEBIAN_FRONTEND")[1].split("\n")[0]
    assert "would write /etc/systemd/system/merlin-kiosk.service" in out
    assert "ExecStart=/usr/bin/cage -s -- /usr/local/bin/merlin --fullscreen" in out
    assert "User=kiosk" in out
    assert "would write /etc/pam.d/merlin-kiosk" in out
    assert "systemctl enable merlin-kiosk.service" in out


def test_kiosk_autostart(tmp_path):
    r = install(tmp_path, "--dry-run", "--kiosk=autostart", "--user", "kiosk")
    assert r.returncode == 0, r.stderr
    assert "would write /etc/xdg/autostart/merlin-kiosk.desktop" in r.stdout
    assert "Exec=/usr/local/bin/merlin --fullscreen" in r.stdout
    assert "merlin-kiosk.service" not in r.stdout.split("kiosk: XDG autostart")[1]


def test_kiosk_refuses_root(tmp_path):
    r = install(tmp_path, "--dry-run", "--kiosk=cage", "--user", "root")
    assert r.returncode == 2
    assert "must not run as root" in r.stderr


def test_uninstall_dry_run(tmp_path):
    prefix = tmp_path / "opt-merlin"
    (prefix / "venv").mkdir(parents=True)
    (prefix / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    r = install(tmp_path, "--dry-run", "--uninstall", "--prefix", str(prefix))
    assert r.returncode == 0, r.stderr
    assert f"would remove {prefix}" in r.stdout
    assert "Kept: chats, settings and downloaded models" in r.stdout
    assert prefix.is_dir()  # a dry run


def test_uninstall_leaves_a_foreign_prefix_alone(tmp_path):
    prefix = tmp_path / "important"
    prefix.mkdir()
    (prefix / "thesis.tex").write_text("...")
    r = install(tmp_path, "--uninstall", "--prefix", str(prefix), "--dry-run")
    assert r.returncode == 0
    assert f"would remove {prefix}" not in r.stdout
    assert "does not look like a Merlin installation" in r.stderr


@pytest.mark.parametrize(
    "os_release, arch, why",
    [
        (FEDORA, "x86_64", "is not Debian or Ubuntu based"),
        (DEBIAN_11, "aarch64", "is too old"),
        (UBUNTU_20, "x86_64", "is too old"),
        (DEBIAN_12, "riscv64", "the CPU architecture is riscv64"),
        (DEBIAN_12, "armv7l", "the CPU architecture is armv7l"),
    ],
)
def test_unsupported_systems(tmp_path, os_release, arch, why):
    r = install(tmp_path, "--dry-run", os_release=os_release, arch=arch)
    assert r.returncode == 3
    assert "this system is not supported" in r.stderr
    assert why in r.stderr
    assert "would run" not in r.stdout


def test_missing_os_release(tmp_path):
    env = dict(os.environ, MERLIN_OS_RELEASE=str(tmp_path / "nope"), MERLIN_ARCH="x86_64")
    r = subprocess.run(
        ["bash", str(INSTALL), "--dry-run"], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 3
    assert "no " in r.stderr and "nope" in r.stderr


# ---------------------------------------------------------------------------- big cores


def make_sysfs(root: Path, capacity=None, max_freq=None, online: str | None = "auto", n=None):
    """A /sys/devices/system/cpu look-alike: cpuN folders with cpu_capacity and/or
    cpufreq/cpuinfo_max_freq, and the `online` file."""
    n = n or len(capacity or max_freq or [])
    for c in range(n):
        d = root / f"cpu{c}"
        d.mkdir(parents=True)
        if capacity is not None:
            (d / "cpu_capacity").write_text(f"{capacity[c]}\n")
        if max_freq is not None:
            (d / "cpufreq").mkdir()
            (d / "cpufreq" / "cpuinfo_max_freq").write_text(f"{max_freq[c]}\n")
    (root / "cpufreq").mkdir(exist_ok=True)  # not a cpu folder
    if online == "auto":
        online = f"0-{n - 1}"
    if online is not None:
        (root / "online").write_text(online + "\n")
    return root


def rk3588(root):
    """RK3588: CPUs 0-3 Cortex-A55 (capacity 414), 4-7 Cortex-A76 (1024; two clusters with
    slightly different top clocks)."""
    return make_sysfs(
        root,
        capacity=[414] * 4 + [1024] * 4,
        max_freq=[1800000] * 4 + [2352000, 2352000, 2304000, 2304000],
    )


def test_rk3588_big_cores(tmp_path):
    topo = cpu.read_topology(rk3588(tmp_path))
    assert topo.source == "cpu_capacity"
    assert topo.cpus == tuple(range(8))
    assert topo.big_cores() == (4, 5, 6, 7)
    assert "heterogeneous" in topo.describe() and "4-7 (capacity 1024)" in topo.describe()
    p = cpu.choose("big", None, topology=topo, allowed=tuple(range(8)))
    assert p.cpus == (4, 5, 6, 7) and p.threads == 4 and p.mode == "big"
    assert "big cores: CPUs 4-7, 4 kernel threads" in p.describe()
    assert cpu.choose("all", None, topology=topo, allowed=tuple(range(8))).threads == 8
    p = cpu.choose("big", 2, topology=topo, allowed=tuple(range(8)))
    assert p.cpus == (4, 5, 6, 7) and p.threads == 2
    p = cpu.choose("0-1,6", None, topology=topo, allowed=tuple(range(8)))
    assert p.cpus == (0, 1, 6) and p.threads == 3 and p.mode == "list"


def test_rk3588_in_a_container_limited_to_little_cores(tmp_path):
    topo = cpu.read_topology(rk3588(tmp_path))
    p = cpu.choose("big", None, topology=topo, allowed=(0, 1, 4))
    assert p.cpus == (4,) and "5-7 not available" in p.note
    p = cpu.choose("big", None, topology=topo, allowed=(0, 1))
    assert p.cpus == (0, 1) and "not available to this process" in p.note


def test_uniform_x86(tmp_path):
    topo = cpu.read_topology(make_sysfs(tmp_path, max_freq=[3600000] * 16))
    assert topo.source == "cpuinfo_max_freq" and topo.uniform
    assert topo.big_cores() == tuple(range(16))
    p = cpu.choose("big", None, topology=topo, allowed=tuple(range(16)))
    assert p.cpus == tuple(range(16)) and p.threads == 16
    assert p.describe().startswith("all cores: CPUs 0-15, 16 kernel threads")


def test_uniform_capacity(tmp_path):
    topo = cpu.read_topology(make_sysfs(tmp_path, capacity=[1024] * 4))
    assert topo.uniform and topo.big_cores() == (0, 1, 2, 3)


def test_only_cpufreq_big_little(tmp_path):
    # an older arm64 kernel without cpu_capacity, and a core whose sysfs lacks cpu_capacity
    topo = cpu.read_topology(
        make_sysfs(tmp_path, max_freq=[1800000] * 4 + [2400000] * 4, capacity=None)
    )
    assert topo.source == "cpuinfo_max_freq"
    assert topo.big_cores() == (4, 5, 6, 7)


def test_partial_capacity_falls_back_to_frequency(tmp_path):
    root = make_sysfs(tmp_path, capacity=[414] * 4 + [1024] * 4, max_freq=[1] * 4 + [2] * 4)
    (root / "cpu7" / "cpu_capacity").unlink()
    topo = cpu.read_topology(root)
    assert topo.source == "cpuinfo_max_freq" and topo.big_cores() == (4, 5, 6, 7)


def test_three_clusters_keep_prime_and_big(tmp_path):
    topo = cpu.read_topology(make_sysfs(tmp_path, capacity=[325] * 4 + [870] * 3 + [1024]))
    assert topo.big_cores() == (4, 5, 6, 7)


def test_nothing_known(tmp_path):
    topo = cpu.read_topology(make_sysfs(tmp_path, n=6, online=None))
    assert topo.source == "none" and topo.cpus == tuple(range(6))
    assert topo.big_cores() == topo.cpus
    assert "no capacity or frequency information" in topo.describe()
    p = cpu.choose("big", None, topology=topo, allowed=tuple(range(6)))
    assert p.cpus == tuple(range(6)) and p.threads == 6


def test_no_sysfs_at_all(tmp_path):
    topo = cpu.read_topology(tmp_path / "missing")
    assert topo.source == "none" and len(topo.cpus) == (os.cpu_count() or 1)


def test_offline_cpus_are_left_out(tmp_path):
    root = rk3588(tmp_path)
    (root / "online").write_text("0-5\n")
    topo = cpu.read_topology(root)
    assert topo.cpus == tuple(range(6)) and topo.big_cores() == (4, 5)


def test_cpu_lists():
    assert cpu.parse_cpu_list("0-3,6") == (0, 1, 2, 3, 6)
    assert cpu.parse_cpu_list(" 7 , 2-3 ") == (2, 3, 7)
    assert cpu.format_cpu_list((0, 1, 2, 3, 6, 8, 9)) == "0-3,6,8-9"
    for bad in ("", "x", "3-1", "-1", "1,,2", "0-"):
        with pytest.raises(InputError):
            cpu.parse_cpu_list(bad)


def test_choose_errors(tmp_path):
    topo = cpu.read_topology(rk3588(tmp_path))
    with pytest.raises(InputError, match="does not exist"):
        cpu.choose("8-9", None, topology=topo, allowed=tuple(range(8)))
    with pytest.raises(InputError, match="not a CPU list"):
        cpu.choose("fast", None, topology=topo, allowed=tuple(range(8)))
    with pytest.raises(InputError, match="threads"):
        cpu.choose("big", -2, topology=topo, allowed=tuple(range(8)))


def test_this_machine():
    p = cpu.choose("big")
    assert p.cpus and set(p.cpus) <= set(os.sched_getaffinity(0))
    assert p.threads == len(p.cpus)


def test_cli_info_prints_the_placement(demo_dir, capsys):
    from merlin.engine.cli import main

    assert main(["info", "--model", str(demo_dir)]) == 0
    out = capsys.readouterr().out
    assert "cpu:" in out and "threads:" in out and "kernel thread" in out
    assert main(["info", "--model", str(demo_dir), "--cpus", "all", "--threads", "1"]) == 0
    assert "1 kernel thread (--cpus all)" in capsys.readouterr().out


# ---------------------------------------------------------------------------- warm-up


def test_warmup_formats():
    from merlin.engine.warmup import KV_CHOICES, WEIGHT_CHOICES, parse_formats

    assert parse_formats(None, WEIGHT_CHOICES, "q8") == ("q8",)
    assert parse_formats("all", WEIGHT_CHOICES, "f32") == ("f32", "q8", "q4")
    assert parse_formats("q4,f32", WEIGHT_CHOICES, "f32") == ("f32", "q4")
    with pytest.raises(InputError):
        parse_formats("q4", KV_CHOICES, "f32")


def test_warmup_plan_covers_every_variant():
    from merlin.engine.warmup import plan

    labels = [s.label for s in plan(("f32", "q8", "q4"), ("f32", "q8"))]
    text = "\n".join(labels)
    for fmt in ("f32", "q8", "q4"):
        assert f"{fmt} weights, f32 KV: image question" in text
        assert f"{fmt} weights, q8 KV: question" in text
    assert "q8 weights from the disk cache" in text and "q4 weights from the disk cache" in text
    assert "f32 weights from the disk cache" not in text  # f32 is never cached
    assert any("sampling" in label for label in labels)


def test_warmup_runs_with_progress(demo_dir, tmp_path, monkeypatch):
    from merlin.engine import warmup

    monkeypatch.setenv(warmup.ENV_STAMPS, str(tmp_path / "stamps"))
    seen = []
    timings = warmup.warm_up(
        ("f32",), ("f32",), progress=lambda f, p: seen.append((f, p)), model_dir=demo_dir
    )
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert len(timings) == len(warmup.plan(("f32",), ("f32",)))
    assert not warmup.is_warm("f32", "f32")  # a foreign checkpoint stamps nothing
    warmup.mark_warm("f32", "f32")
    assert warmup.is_warm("f32", "f32") and not warmup.is_warm("q8", "f32")
    assert warmup.stamp_path("f32", "f32").parent == tmp_path / "stamps"


def test_an_interrupted_warmup_removes_its_weight_cache(demo_dir, tmp_path, monkeypatch):
    """A Ctrl-C during the warm-up left its private converted-weight cache (megabytes in the
    temporary folder) at every interruption; so did a child warm-up the app cancelled."""
    import tempfile

    from merlin.engine import warmup

    monkeypatch.setenv(warmup.ENV_STAMPS, str(tmp_path / "stamps"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(warmup, "run_question", interrupted)  # right after the first load
    with pytest.raises(KeyboardInterrupt):
        warmup.warm_up(("q8",), ("f32",), model_dir=demo_dir)
    assert not list(scratch.iterdir())


def test_warmup_child_command(monkeypatch):
    import sys

    from merlin.engine.warmup import child_command

    assert child_command("q8", "f32")[1:3] == ["-m", "merlin.engine.warmup"]
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    cmd = child_command("q8", "f32")
    assert cmd[0] == sys.executable and cmd[1] == "--warmup" and "--json-progress" in cmd


def test_run_app_reads_relative_paths_from_where_it_was_started(tmp_path):
    """`bash scripts/run-app.sh --model "my models/demo"` looked for the folder in the
    checkout (the script changed into it before starting merlin)."""
    checkout = tmp_path / "check out"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "run-app.sh", checkout / "scripts")
    for name in ("system-deps.sh", "venv.sh"):  # set-up that has nothing to do here
        (checkout / "scripts" / name).write_text("exit 0\n")
    (checkout / ".venv" / "bin").mkdir(parents=True)
    merlin = checkout / ".venv" / "bin" / "merlin"
    merlin.write_text('#!/bin/sh\npwd\nfor a in "$@"; do echo "$a"; done\n')
    merlin.chmod(0o755)
    caller = tmp_path / "elsewhere"
    caller.mkdir()
    done = subprocess.run(
        ["bash", str(checkout / "scripts" / "run-app.sh"), "--model", "my models/demo"],
        cwd=caller, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(caller), "--model", "my models/demo"]


def test_a_venv_of_a_python_upgraded_in_place_is_made_anew(tmp_path, monkeypatch):
    """Debian 12 to 13 moves /usr/bin/python3 from 3.11 to 3.12 at the same path: the venv's
    pyvenv.cfg still names that folder, and re-running the installer had kept the venv, whose
    packages the new Python cannot import."""
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text('#!/bin/sh\necho "(3, 12)"\n')
    python.chmod(0o755)
    prefix = tmp_path / "opt-merlin"
    venv_python = prefix / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text('#!/bin/sh\necho "(3, 11)"\n')
    venv_python.chmod(0o755)
    (prefix / "venv" / "pyvenv.cfg").write_text(f"home = {python.parent}\n")
    monkeypatch.setenv("MERLIN_PYTHON", str(python))
    r = install(tmp_path, "--dry-run", "--no-apt", "--no-warmup", "--prefix", str(prefix))
    assert r.returncode == 0, r.stderr
    assert "made with another Python: making it anew" in r.stdout


FAKE_PYTHON = """#!/bin/sh
# a Python for install.sh's steps: venv, pip (logged; FAKE_PIP says what the network allows), -c
case "$1 $2" in
  "-m venv") mkdir -p "$3/bin"; cp "$0" "$3/bin/python"
             echo "home = $(dirname "$(readlink -f "$0")")" > "$3/pyvenv.cfg"; exit 0 ;;
  "-m pip") shift 2; echo "pip $*" >> "$FAKE_LOG"
            case " $* " in *" --upgrade pip "*) [ "$FAKE_PIP" = online ]; exit ;; esac
            case " $* " in
              *" --no-index "*) [ "$FAKE_PIP" != offline-missing ]; exit ;;
              *) [ "$FAKE_PIP" = online ]; exit ;;
            esac ;;
  "-m compileall") exit 0 ;;
  "-c "*) echo "(3, 12)"; exit 0 ;;
esac
exit 1
"""


def run_install_venv(tmp_path, network):
    """install.sh's install_venv step against an installation of an older Merlin, with a fake
    Python whose pip reaches the package index or not (FAKE_PIP)."""
    python = tmp_path / "python" / "python3"
    python.parent.mkdir()
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    source = tmp_path / "new source"
    (source / "src" / "merlin").mkdir(parents=True)
    (source / "VERSION").write_text("new\n")
    prefix = tmp_path / "opt-merlin"
    (prefix / "src").mkdir(parents=True)
    (prefix / "src" / "VERSION").write_text("old\n")
    subprocess.run([str(python), "-m", "venv", str(prefix / "venv")], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = (
        f'source "{INSTALL}"; PREFIX="{prefix}"; SRC="{source}"; BIN="{bin_dir}"; '
        f'PYTHON="{python}"; ARCH=x86_64; install_venv'
    )
    log = tmp_path / "pip.log"
    env = dict(os.environ, FAKE_PIP=network, FAKE_LOG=str(log))
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                          timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    pip_calls = log.read_text().splitlines() if log.exists() else []
    return done, prefix, pip_calls


def test_a_re_run_without_the_network_installs_with_the_packages_it_has(tmp_path):
    """A board is often offline: re-running the installer there stopped at pip (its upgrade of
    itself, then the build dependencies of Merlin's editable install) after the new source was
    in place."""
    done, prefix, pip_calls = run_install_venv(tmp_path, "offline")
    assert done.returncode == 0, done.stderr
    assert (prefix / "src" / "VERSION").read_text() == "new\n"
    assert not (prefix / "src.old").exists() and not (prefix / "src.new").exists()
    assert "--no-index --no-build-isolation" in pip_calls[-1]
    assert "pip was not upgraded" in done.stdout
    assert "installing with the packages the venv already has" in done.stdout
    assert (tmp_path / "bin" / "merlin").is_symlink()


def test_an_online_install_puts_the_build_backend_in_the_venv(tmp_path):
    done, prefix, pip_calls = run_install_venv(tmp_path, "online")
    assert done.returncode == 0, done.stderr
    assert len(pip_calls) == 2 and "setuptools>=70.1" in pip_calls[1]
    assert (prefix / "src" / "VERSION").read_text() == "new\n"


def test_an_offline_re_run_that_needs_new_packages_keeps_the_installed_merlin(tmp_path):
    done, prefix, _ = run_install_venv(tmp_path, "offline-missing")
    assert done.returncode == 2
    assert "The installed Merlin is unchanged" in done.stderr
    assert (prefix / "src" / "VERSION").read_text() == "old\n"
    assert not (prefix / "src.old").exists() and not (prefix / "src.new").exists()
    assert not (tmp_path / "bin" / "merlin").exists()
