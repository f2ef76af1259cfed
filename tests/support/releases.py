"""The previous release of pkgq, to run beside this one: its tag, its code checked out as a git
worktree, and a virtualenv of its own to run it in (tests/e2e/test_rolling_upgrade.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")


def current_version() -> tuple[int, int, int]:
    """This checkout's version, as pyproject.toml says."""
    text = (REPO / "pyproject.toml").read_text()
    major, minor, patch = tomllib.loads(text)["project"]["version"].split(".")
    return int(major), int(minor), int(patch)


def git(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def previous_release() -> str:
    """The git ref of the newest release older than this checkout's version: its tag
    (vX.Y.Z), or, in a clone without tags, its commit as releases.txt records it (the two must
    agree where both are there)."""
    current = current_version()
    recorded: dict[tuple[int, ...], str] = {}
    for line in (REPO / "releases.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            version, commit = line.split()
            recorded[tuple(int(n) for n in version.split("."))] = commit
    tagged: dict[tuple[int, ...], str] = {}
    for tag in git("tag", "--list", "v*").split():
        found = TAG.match(tag)
        if found is not None:
            tagged[tuple(int(n) for n in found.groups())] = tag
    older = sorted(v for v in {*recorded, *tagged} if v < current)
    if not older:
        raise RuntimeError(f"no release older than {'.'.join(map(str, current))} is recorded")
    newest = older[-1]
    if newest in tagged and newest in recorded:
        commit = git("rev-parse", f"{tagged[newest]}^{{commit}}").strip()
        if commit != recorded[newest]:
            raise RuntimeError(
                f"{tagged[newest]} is {commit}, releases.txt says {recorded[newest]}"
            )
    return tagged.get(newest) or recorded[newest]


def checkout(tag: str, into: Path) -> Path:
    """The release's code as a detached worktree in `into` (remove with `remove`)."""
    git("worktree", "add", "--detach", "--force", str(into), tag)
    return into


def remove(worktree: Path) -> None:
    git("worktree", "remove", "--force", str(worktree))


def dependencies_of(root: Path) -> tuple[object, str]:
    """What a checkout installs: its pyproject's dependencies and its constraints file."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return project["dependencies"], (root / "constraints.txt").read_text()


def _pins(constraints: str) -> set[str]:
    """The pins of a constraints file (`name==version` lines, comments and blanks left out)."""
    return {
        line.split("#", 1)[0].strip()
        for line in constraints.splitlines()
        if line.split("#", 1)[0].strip()
    }


def venv_for(worktree: Path, into: Path) -> Path:
    """A virtualenv that runs the release in `worktree`: its own interpreter and site-packages,
    where the release's code comes first on the path. When the release has the same
    dependencies as this checkout and every pin of its constraints holds here too (the usual
    case between two adjacent releases; this one may pin more, e.g. new dev tools), their
    installed copies are shared with this virtualenv instead of installed again (a minute on
    this machine); otherwise they are installed into it from the release's constraints, with
    the project's uv where ensure-venv.sh put it (1.7 s where pip took 16), else with pip.
    Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(into)], check=True)
    python = into / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    paths = [str(worktree)]
    theirs, their_pins = dependencies_of(worktree)
    ours, our_pins = dependencies_of(REPO)
    if theirs == ours and _pins(their_pins) <= _pins(our_pins):
        paths.append(sysconfig.get_paths()["purelib"])
    else:
        # Their dependencies only, at their pins: the release's code itself is the worktree's
        # (the .pth below), never an installed copy that would come first on the path.
        assert isinstance(theirs, list)
        wanted = ["-c", str(worktree / "constraints.txt"), *map(str, theirs)]
        uv = Path(sys.executable).parent / "uv"
        with_uv = [str(uv), "pip", "install", "--quiet", "--python", str(python)]
        installed = (
            uv.exists()
            and subprocess.run([*with_uv, "--compile-bytecode", *wanted], check=False).returncode
            == 0
        )
        if not installed:
            pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
            subprocess.run(pip + wanted, check=True)
    (Path(purelib) / "pkgq-release.pth").write_text("\n".join(paths) + "\n")
    return python
