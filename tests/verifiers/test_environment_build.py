"""The verifiers environment's build: uv into a temporary directory, renamed into place with a marker, reused
from the cache, rebuilt when a local package changes, and a failed install refused in one line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import loops_nb.verifiers.environment_build as build
from loops_nb.errors import UserError
from loops_nb.verifiers.environment_build import MARKER, EnvironmentBuild, verifiers_environment

PYPROJECT = """[project]
name = "tiny-vf-env"
version = "0.1.0"

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[tool.hatch.build.targets.wheel]
packages = ["tiny_vf_env"]
"""


def local_package(root: Path) -> Path:
    (root / "tiny_vf_env").mkdir(parents=True)
    (root / "tiny_vf_env" / "__init__.py").write_text("VALUE = 1\n")
    (root / "pyproject.toml").write_text(PYPROJECT)
    return root


async def test_a_build_is_cached_with_its_marker_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = local_package(tmp_path / "pkg")
    job = EnvironmentBuild((str(package),), tmp_path / "cache")
    env = await job.ensure(timeout=600)
    assert env.root == job.root and (job.root / MARKER).is_file()
    assert env.python.exists()
    assert not list(job.cache_dir.glob(".*building")), "the temporary build directory is gone"

    def no_uv() -> str:
        raise AssertionError("a cached environment is not built again")

    monkeypatch.setattr(build, "find_uv", no_uv)
    again = await EnvironmentBuild((str(package),), tmp_path / "cache").ensure(timeout=600)
    assert again == env

    time.sleep(0.01)
    (package / "tiny_vf_env" / "__init__.py").write_text("VALUE = 2\n")
    assert EnvironmentBuild((str(package),), tmp_path / "cache").key != job.key, "an edit builds afresh"


async def test_a_build_without_its_marker_is_not_taken_for_a_finished_one(tmp_path: Path) -> None:
    job = EnvironmentBuild(("anything",), tmp_path / "cache")
    (job.root / "bin").mkdir(parents=True)
    (job.root / "bin" / "python").write_text("")
    assert job.built() is None


async def test_an_install_that_fails_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="could not install") as raised:
        await verifiers_environment(
            [str(tmp_path / "no-such-package")], python=None, cache_dir=str(tmp_path / "cache"), timeout=600
        )
    assert "\n" not in str(raised.value)
    assert not (
        tmp_path / "cache" / EnvironmentBuild((str(tmp_path / "no-such-package"),), tmp_path).key
    ).exists()


async def test_the_cache_directory_comes_from_the_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "elsewhere"))
    assert build.default_cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv(build.CACHE_ENV)
    assert build.default_cache_dir() == Path.home() / ".cache" / "loops_nb" / "verifiers"
