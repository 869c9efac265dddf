"""Exit codes and closing lines say what happened (issue 26): unwritable lakes, files already read, lake
parts that never reached the store, fleets too small to compare, a folder of lakes."""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from tests.conftest import get_free_port

from .helpers import run_aaco, run_aaco_each

pytestmark = pytest.mark.integration

KINETO = ("kineto/a100_alexnet_trace.json.gz", "kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
SHORT_DEADLINE = {"AACO_PIPELINE_SHUTDOWN_TIMEOUT_S": "2"}


@contextlib.contextmanager
def read_only_dir(path: Path) -> Iterator[Path | None]:
    """``path`` as a read-only bind mount of itself (root only), or None where mounts are not allowed."""
    path.mkdir()
    bind = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, check=False)
    if bind.returncode != 0:
        yield None
        return
    try:
        ro = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True, check=False)
        yield path if ro.returncode == 0 else None
    finally:
        subprocess.run(["umount", str(path)], capture_output=True, check=False)


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_an_unwritable_lake_is_one_error_line_and_exit_2(tmp_path, aaco_bin, samples):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    with read_only_dir(tmp_path / "ro") as ro:
        targets = {"/proc/aaco": "No such file or directory", str(a_file): "Not a directory"}
        if ro is not None:
            targets[str(ro / "lake")] = "Read-only file system"
        trace = str(samples / KINETO[0])
        commands = []
        for lake in targets:
            commands += [
                ("replay", trace, "--out", lake, "--no-progress"),
                ("run", "-n", "1", "--warmup", "0", "--out", lake, "--no-progress"),
                ("agent", "--lake", lake, "--metrics-port", str(get_free_port())),
            ]
        results = run_aaco_each(aaco_bin, *commands)
    for args, proc in zip(commands, results, strict=True):
        lake = args[args.index("--out") + 1] if "--out" in args else args[args.index("--lake") + 1]
        assert proc.returncode == 2, (args, proc.stderr)
        line = one_error(proc)
        assert line.startswith(f"error: {lake}: cannot write the lake here: {targets[lake]}"), line
        assert "choose a writable directory with --out, --lake or exporters.lake.path" in line
    if ro is None:
        pytest.skip("no read-only bind mount here (not root): the file and /proc cases were checked")


def test_a_replay_of_files_the_lake_holds_says_so_once(tmp_path, aaco_bin, samples):
    lake = tmp_path / "lake"
    args = ("replay", *(str(samples / k) for k in KINETO), "--out", str(lake), "--no-progress")
    first = run_aaco(aaco_bin, *args)
    assert first.returncode == 0, first.stderr
    assert "replayed 2 file(s), 116 rows, into" in first.stderr
    again = run_aaco(aaco_bin, *args)
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""  # no summary table of nothing
    assert again.stderr.splitlines() == [
        "already in the lake: 2 file(s), 0 new rows; --force to read again",
        f"replayed 0 file(s), 0 rows, into {lake}",
    ]
    forced = run_aaco(aaco_bin, *args, "--force")
    assert forced.returncode == 0 and "replayed 2 file(s), 116 rows" in forced.stderr, forced.stderr


def test_fleet_commands_take_a_folder_of_lakes_and_say_why_there_are_no_outliers(tmp_path, aaco_bin, samples):
    lakes = tmp_path / "lakes"
    replays = run_aaco_each(
        aaco_bin,
        *(
            ("replay", str(samples / KINETO[1]), "--out", str(lakes / n), "--node", n, "--no-progress")
            for n in ("gpu-a", "gpu-b", "gpu-c")
        ),
    )
    assert all(p.returncode == 0 for p in replays), [p.stderr for p in replays]
    summary, outliers, one_node, nothing, models = run_aaco_each(
        aaco_bin,
        ("fleet", "summary", "--lake", f"{lakes}/", "--json"),
        ("fleet", "outliers", "--lake", f"{lakes}/"),
        ("fleet", "outliers", "--lake", str(lakes / "gpu-a")),
        ("fleet", "families", "--lake", str(lakes), "--since", "1s"),
        ("fleet", "models", "--lake", str(lakes)),
    )
    assert summary.returncode == 0, summary.stderr
    assert '"node": "gpu-a"' in summary.stdout and '"node": "gpu-c"' in summary.stdout
    assert outliers.returncode == 0 and outliers.stdout == "", outliers.stderr
    assert outliers.stderr.strip() == (
        "no outliers: every node's p95 is near the fleet's (mi250_minitoy_train_ROCm6_2_kineto on 3 nodes)"
    )
    assert one_node.returncode == 0 and one_node.stderr.strip() == (
        "no outliers: too few nodes to compare (3 needed per model): mi250_minitoy_train_ROCm6_2_kineto on 1 node(s)"
    )
    assert nothing.returncode == 0 and nothing.stdout == ""
    assert nothing.stderr.strip() == "kernel families: nothing in the lake (for the time asked)"
    assert models.returncode == 0 and all(n in models.stdout for n in ("gpu-a", "gpu-b", "gpu-c"))


def local_parts(lake: Path) -> int:
    return sum(1 for _ in lake.glob("*/date=*/node=*/part-*.parquet"))


def remote_parts(seaweed, url: str) -> int:
    fs = seaweed.filesystem()
    base = url.removeprefix("s3://")
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return sum(1 for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet"))


def replay_to_store(aaco_bin, trace: str, url: str, local: Path, env: dict[str, str]):
    return run_aaco(
        aaco_bin, "replay", trace, "--out", url, "--no-progress", env={**env, "AACO_EXPORTERS_LAKE_PATH": str(local)}
    )


def test_lake_parts_that_never_reached_the_store_are_a_failing_exit_with_the_count_and_why(
    tmp_path, aaco_bin, samples, seaweed, s3_lake_url
):
    trace = str(samples / KINETO[1])
    dead = {**seaweed.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{get_free_port()}", **SHORT_DEADLINE}
    wrong = {**seaweed.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret", **SHORT_DEADLINE}
    for name, env, why in (
        ("dead", dead, "cannot reach the store"),
        ("wrong", wrong, "the store refused the credentials"),
    ):
        local = tmp_path / name
        proc = replay_to_store(aaco_bin, trace, s3_lake_url, local, env)
        assert proc.returncode == 3, proc.stderr
        line = one_error(proc)
        found = re.match(r"error: (\d+) lake part\(s\) \((\d+) bytes\) not shipped to (\S+): (.*)", line)
        assert found, line
        assert int(found.group(1)) == local_parts(local) > 0
        assert found.group(3) == s3_lake_url and found.group(4).startswith(why), line
        assert f"they stay in {local}" in line and "the same command again" in line
        assert proc.stderr.splitlines()[-1].endswith(f"NOT shipped to {s3_lake_url})")
        assert "(shipped to" not in proc.stderr
    again = replay_to_store(aaco_bin, trace, s3_lake_url, tmp_path / "dead", seaweed.env)
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines()[-1].endswith(f"(shipped to {s3_lake_url})")
    assert remote_parts(seaweed, s3_lake_url) == local_parts(tmp_path / "dead")
