# The serving stack as wheels for a GPU box that has torch and Triton but no network and no pip
# index (docs/benchmarks.md, benchmarks/device_serve.sh installs them from .whl/): fleetlm's
# runtime dependencies and theirs, at the versions installed in this .venv, minus what the
# box's image already holds (IMAGE_HAS, from the device notes' package list), downloaded for
# CPython 3.12 on manylinux x86-64 into .whl/.
#   .venv/bin/python -m benchmarks.fetch_wheels [--dest .whl] [--dry-run]
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# Packages the GPU image ships (normalised names); carried only if missing there.
IMAGE_HAS = set(
    [
        "aiohappyeyeballs",
        "aiohttp",
        "aiosignal",
        "anyio",
        "attrs",
        "certifi",
        "charset-normalizer",
        "click",
        "filelock",
        "frozenlist",
        "fsspec",
        "h11",
        "hf-xet",
        "httpcore",
        "httpx",
        "huggingface-hub",
        "idna",
        "jinja2",
        "markupsafe",
        "msgpack",
        "multidict",
        "numpy",
        "packaging",
        "prometheus-client",
        "propcache",
        "psutil",
        "python-dateutil",
        "pyyaml",
        "regex",
        "requests",
        "safetensors",
        "six",
        "tokenizers",
        "torch",
        "tqdm",
        "transformers",
        "triton",
        "typing-extensions",
        "urllib3",
        "uvloop",
        "yarl",
    ]
)
# Test-only packages the GPU tests import (tests/engine/test_structured_output.py's validation,
# which test_overlap_gpu.py loads): carried too, or those tests stop at collection on the box.
GPU_TEST_ROOTS = ["jsonschema"]
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_34_x86_64", "manylinux_2_35_x86_64", "manylinux1_x86_64"]  # fmt: skip


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure() -> dict[str, str]:
    """{normalised name: installed version} of fleetlm's runtime dependencies, transitively,
    with each requirement's extras and markers as this interpreter evaluates them. Packages the
    image has are not walked into (their own dependencies come with them there)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in [*project["dependencies"], *GPU_TEST_ROOTS]]
    seen: dict[str, str] = {}
    extras_done: dict[str, set[str]] = {}
    while todo:
        req = todo.pop()
        name = norm(req.name)
        if name in IMAGE_HAS or (req.marker and not req.marker.evaluate({"extra": ""})):  # roots
            continue
        new_extras = set(req.extras) - extras_done.get(name, set())
        if name in seen and not new_extras:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # an optional platform dependency not installed here
        first = name not in seen
        seen[name] = dist.version
        extras_done.setdefault(name, set()).update(new_extras)
        for spec in dist.requires or []:
            sub = Requirement(spec)
            if not sub.marker:
                wanted = first
            elif sub.marker.evaluate({"extra": ""}):
                wanted = first  # a platform marker, no extra
            else:  # redis[hiredis], psycopg[binary], celery[redis]
                wanted = any(sub.marker.evaluate({"extra": e}) for e in new_extras)
            if wanted:
                sub.marker = None  # evaluated here, with the extra that wanted it
                todo.append(sub)
    return seen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dest", type=Path, default=ROOT / ".whl")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    need = {n: v for n, v in sorted(closure().items()) if n not in IMAGE_HAS}
    print(f"{len(need)} packages to carry: " + ", ".join(f"{n}=={v}" for n, v in need.items()))
    if args.dry_run:
        return 0
    args.dest.mkdir(exist_ok=True)
    # A wheel of another version of a package we carry (an earlier run's) would make pip on the
    # box refuse the set as conflicting: drop it.
    for old in args.dest.glob("*.whl"):
        name, version = old.name.split("-")[:2]
        if norm(name) in need and version != need[norm(name)]:
            old.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(args.dest)]  # fmt: skip
    for p in PLATFORMS:
        cmd += ["--platform", p]
    failed = []
    for name, version in need.items():
        r = subprocess.run([*cmd, f"{name}=={version}"], capture_output=True, text=True)
        if r.returncode:
            failed.append(name)
            print(f"  {name}=={version}: {r.stderr.strip().splitlines()[-1:]}")
    size = sum(f.stat().st_size for f in args.dest.glob("*.whl")) / 2**20
    print(f"{args.dest}: {len(list(args.dest.glob('*.whl')))} wheels, {size:.1f} MiB"
          + (f"; failed: {', '.join(failed)}" if failed else ""))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
