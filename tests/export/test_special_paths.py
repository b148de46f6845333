"""`export` and `compress` never replace a symlink, device node, FIFO or directory at their output.

Both write a temp file and rename it over the output; a rename over a symlink or a device node
replaces the link or node itself (as root, `--output /dev/null` replaced the system's /dev/null).
They must refuse such a path up front: exit 2, one line naming the path and what it is, and the
planted node left exactly as it was. Nodes are planted in tmp_path, never at a real /dev path.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.commands import run_trajforge
from tests.support.compress_data import trajectory, write_jsonl


def _cli(cwd: Path, *args: object) -> subprocess.CompletedProcess[str]:
    return run_trajforge(*args, cwd=cwd)


def _fifo(path: Path, tmp: Path) -> None:
    os.mkfifo(path)


def _chardev(path: Path, tmp: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("creating a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private node like /dev/null


def _link_to_file(path: Path, tmp: Path) -> None:
    (tmp / "target.jsonl").write_text("precious\n")
    os.symlink(tmp / "target.jsonl", path)


def _dangling_link(path: Path, tmp: Path) -> None:
    os.symlink(tmp / "nowhere.jsonl", path)


def _directory(path: Path, tmp: Path) -> None:
    path.mkdir()
    (path / "notes.txt").write_text("precious\n")


PLANTS: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "fifo": (_fifo, "is a FIFO; give a regular file path"),
    "chardev": (_chardev, "is a character device; give a regular file path"),
    "link": (_link_to_file, "is a symbolic link; give a regular file path"),
    "dangling": (_dangling_link, "is a symbolic link; give a regular file path"),
    "directory": (_directory, "is a directory"),
}


def _snapshot(path: Path, tmp: Path) -> tuple[object, ...]:
    """Everything a refused command must leave unchanged: the node itself and what it points to."""
    st = os.lstat(path)
    link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    listing = sorted((p.name, p.read_text()) for p in path.iterdir()) if stat.S_ISDIR(st.st_mode) else None
    target = (tmp / "target.jsonl").read_text() if (tmp / "target.jsonl").exists() else None
    return stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev, link, listing, target


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "in.jsonl", [trajectory(i, steps=2, response_words=10) for i in range(2)])


def _refused(proc: subprocess.CompletedProcess[str], out: Path, message: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()  # one line, naming the path and what it is
    assert line.startswith(f"error: --output: {out} {message}"), line


@pytest.mark.parametrize("plant", list(PLANTS))
@pytest.mark.parametrize("overwrite", [True, False])
def test_export_refuses_a_special_output(plant: str, overwrite: bool, src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    make, message = PLANTS[plant]
    make(out, tmp_path)
    before = _snapshot(out, tmp_path)
    flags = ["--overwrite"] if overwrite else []
    proc = _cli(tmp_path, "export", src, "--format", "openai", "--output", out, *flags)
    _refused(proc, out, message)
    assert _snapshot(out, tmp_path) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_export_directory_format_refuses_a_symlink_to_an_export(src: Path, tmp_path: Path) -> None:
    assert _cli(tmp_path, "export", src, "--format", "hf", "--output", "real_hf").returncode == 0
    out = tmp_path / "hf"
    os.symlink(tmp_path / "real_hf", out)
    files = sorted(p.relative_to(tmp_path) for p in (tmp_path / "real_hf").rglob("*"))
    proc = _cli(tmp_path, "export", src, "--format", "hf", "--output", out, "--overwrite")
    assert proc.returncode == 2 and f"--output: {out} is a symbolic link; give a directory path" in proc.stderr
    assert os.readlink(out) == str(tmp_path / "real_hf")
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "real_hf").rglob("*")) == files


@pytest.mark.parametrize("plant", list(PLANTS))
def test_compress_refuses_a_special_output(plant: str, src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    make, message = PLANTS[plant]
    make(out, tmp_path)
    before = _snapshot(out, tmp_path)
    proc = _cli(tmp_path, "compress", "--input", src, "--output", out, "--target_max_tokens", "100000")
    _refused(proc, out, message)
    assert _snapshot(out, tmp_path) == before
    assert {p.name for p in tmp_path.iterdir()} <= {"in.jsonl", "out.jsonl", "target.jsonl"}  # nothing written


def test_compress_refuses_a_symlink_at_its_metrics_file(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    metrics = tmp_path / "out_metrics.json"
    _link_to_file(metrics, tmp_path)
    proc = _cli(tmp_path, "compress", "--input", src, "--output", out, "--target_max_tokens", "100000")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"--output: {metrics} (written beside --output {out}) is a symbolic link" in proc.stderr
    assert os.readlink(metrics) == str(tmp_path / "target.jsonl")
    assert (tmp_path / "target.jsonl").read_text() == "precious\n" and not out.exists()


@pytest.mark.parametrize("command", ["export", "compress"])
def test_a_fifo_input_is_named_as_one(command: str, tmp_path: Path) -> None:
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    args = [fifo, "--format", "openai"] if command == "export" else ["--input", fifo]
    proc = _cli(tmp_path, command, *args, "--output", tmp_path / "out.jsonl")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {fifo}: a FIFO, not a regular file"), proc.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and not (tmp_path / "out.jsonl").exists()


def test_a_regular_output_is_still_written(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    assert _cli(tmp_path, "export", src, "--format", "sharegpt", "--output", out).returncode == 2  # no --overwrite
    proc = _cli(tmp_path, "export", src, "--format", "sharegpt", "--output", out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == src.read_bytes()
    proc = _cli(tmp_path, "compress", "--input", src, "--output", tmp_path / "c.jsonl", "--target_max_tokens", "100000")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "c.jsonl").read_bytes() == src.read_bytes()
