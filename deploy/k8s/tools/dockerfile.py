"""The Dockerfile and .dockerignore, checked statically by deploy/k8s/verify.sh: multi-stage, a
numeric non-root USER, the Makefile's install line without dev extras, tagged base images, and
a build context that holds what `pip install .` reads."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from workloads import image_tagged

LEFT_OUT = {"devtools/"}
"""Packages kept out of the image on purpose: the bench and the demo are not production code
(README, Layout); the package list names them for the dev install only."""


def dockerfile_errors(repo: Path) -> list[str]:
    errors: list[str] = []
    text = (repo / "Dockerfile").read_text()
    logical = re.sub(r"\\\n", " ", text)
    lines = [ln.strip() for ln in logical.splitlines() if ln.strip() and not ln.startswith("#")]
    args = dict(
        re.match(r"ARG\s+(\w+)=(\S+)", ln).groups()  # type: ignore[union-attr]
        for ln in lines
        if re.match(r"ARG\s+\w+=\S+", ln)
    )
    stages = [ln for ln in lines if ln.upper().startswith("FROM ")]
    if len(stages) < 2:
        errors.append("Dockerfile: not multi-stage")
    for stage in stages:
        image = stage.split()[1]
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
        if not image_tagged(image):
            errors.append(f"Dockerfile: base image {image!r} needs a tag, not latest")
    final = lines[lines.index(stages[-1]) :] if stages else []
    users = [ln.split()[1] for ln in final if ln.upper().startswith("USER ")]
    uid = users[-1].split(":")[0] if users else ""
    if not uid.isdigit() or int(uid) == 0:
        errors.append("Dockerfile: the final stage must end with a numeric non-root USER")
    if not any("--from=" in ln for ln in final if ln.upper().startswith("COPY")):
        errors.append("Dockerfile: the final stage must copy the built venv from a build stage")
    installs = [ln for ln in lines if "pip install" in ln and "-c constraints.txt" in ln]
    if not installs:
        errors.append("Dockerfile: pkgq must be installed with `pip install -c constraints.txt`")
    for line in installs:
        if re.search(r"\s-e\s|--editable|\[dev\]", line):
            errors.append("Dockerfile: the image install must be non-editable, without [dev]")
    if any(re.search(r"(pip install.*(pytest|mypy|ruff))", ln) for ln in lines):
        errors.append("Dockerfile: dev tools must stay out of the image")

    # The build context .dockerignore lets through must hold what `pip install .` reads.
    patterns = [
        ln.strip()
        for ln in (repo / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    needed = {"pyproject.toml", "constraints.txt", project["project"]["readme"]}
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        needed.add(pattern.rstrip("*") + "/")
    needed -= LEFT_OUT
    if patterns[:1] != ["*"]:
        errors.append(".dockerignore: must start with `*` (allow-list the build context)")
    for path in sorted(needed - {p.removeprefix("!") for p in patterns if p.startswith("!")}):
        errors.append(f".dockerignore: {path} is needed by the build but not let in")
    return errors
