"""`vllm-mlx serve` with a `distributed` section: start the group through mlx.launch.

Why serve starts mlx.launch (rather than being started under it): the service unit
stays one command (`vllm-mlx serve`) whether or not the model is distributed, and the
parent can fix what mlx.launch does not do for a service: mlx.launch exits 0 even when
a rank failed, so rank 0 prints its exit status on stdout (lockstep.report_exit) and
the parent exits with it; and a stop signal must reach rank 0 alone (which drains, then
stops the others), so mlx.launch runs in its own session and the parent forwards
SIGTERM/SIGINT/SIGHUP to rank 0's pid. Starting serve under mlx.launch by hand works
too (MLX_RANK set: this process is one rank), minus that exit-status fix.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import structlog

from vllm_mlx.config.settings import Settings

if TYPE_CHECKING:
    from vllm_mlx.distributed.rank import Rank

log = structlog.get_logger(__name__)

GROUP_DIR_ENV = "VLLM_MLX_GROUP_DIR"
EXIT_MARKER = "VLLM_MLX_RANK0_EXIT="  # same as lockstep.EXIT_MARKER (no mlx import here)
_LAUNCH = "import sys; from mlx._distributed_utils.launch import main; sys.exit(main())"

_rank: Rank | None = None


def current_rank() -> Rank | None:
    """This process's rank 0, when it leads a group (the daemon shards through it)."""
    return _rank


def enter_group(settings: Settings) -> int | None:
    """The parent: run the whole group, return its exit status. Rank 0: join and
    return None (serve as usual). Other ranks: follow rank 0, return the exit status."""
    global _rank
    if "MLX_RANK" not in os.environ:
        return serve_group(settings, sys.argv[1:])
    from vllm_mlx.distributed.rank import Rank, run_follower

    rank = Rank(settings.distributed)
    if rank.rank == 0:
        _rank = rank
        _write_pid(os.environ.get(GROUP_DIR_ENV))
        return None
    from vllm_mlx.logging import configure_logging

    configure_logging(settings.logging)
    # Rank 0 stops the group (after draining); a stop signal here would cut its batch.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    return run_follower(rank, settings)


@contextlib.asynccontextmanager
async def group_reload() -> AsyncIterator[None]:
    """Around a full reload on rank 0. One that fails after the group re-sharded (a
    later model's load, the new listener) leaves the other ranks on the new model and
    the old engine closed: the group is lost, so fail it (exit 70; the service manager
    starts the group again, on the new config)."""
    rank = _rank
    loads = None if rank is None else rank.status.loads
    try:
        yield
    except Exception as exc:
        if rank is not None and rank.leader is not None and rank.status.loads != loads:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]  # not a backtrace
            rank.leader.failed(f"the reload failed after the group re-sharded: {reason}")
        raise


def leave_group(code: int) -> int:
    """Rank 0 after the daemon returned: a failed group overrides a clean drain."""
    from vllm_mlx.distributed.lockstep import GROUP_FAILED_EXIT, report_exit

    if _rank is not None and _rank.status.failed:
        code = GROUP_FAILED_EXIT
    report_exit(code)
    return code


def _write_pid(directory: str | None) -> None:
    if directory and Path(directory).is_dir():  # a remote rank 0 has no such directory
        (Path(directory) / "rank0.pid").write_text(str(os.getpid()))


def launch_command(settings: Settings, argv: list[str], group_dir: str) -> list[str]:
    d = settings.distributed
    command = [sys.executable, "-c", _LAUNCH, "--backend", d.backend]
    if d.hostfile is not None:
        command += ["--hostfile", str(d.hostfile)]
    else:
        command += ["--hosts", "127.0.0.1", "--repeat-hosts", str(d.ranks)]
    if d.backend == "ring":
        port = d.starting_port or free_port_range(d.size)
        command += ["--starting-port", str(port)]
    command += ["--env", f"{GROUP_DIR_ENV}={group_dir}"]
    return [*command, "--", sys.executable, "-m", "vllm_mlx.cli", *argv]


def free_port_range(count: int) -> int:
    """A first port with `count` free ports after it on 127.0.0.1 (ring: one per rank)."""
    for _ in range(200):
        base = random.randint(20000, 60000 - count)
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range for the ring backend")


def serve_group(settings: Settings, argv: list[str]) -> int:
    """Start every rank through mlx.launch and wait; exit with rank 0's status."""
    group_dir = tempfile.mkdtemp(prefix="vllm-mlx-group-")
    command = launch_command(settings, argv, group_dir)
    print(f"starting {settings.distributed.size} ranks: {' '.join(command)}", file=sys.stderr)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, start_new_session=True)

    def forward(signum: int, frame: FrameType | None) -> None:
        pid_file = Path(group_dir) / "rank0.pid"
        try:
            os.kill(int(pid_file.read_text()), signum)
        except (OSError, ValueError):  # rank 0 not up (yet), or remote: stop them all
            if signum != signal.SIGHUP:
                # mlx.launch leads its own process group: the local ranks die with it
                # (they ignore stop signals only once they have joined the group).
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal.SIGTERM)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    code: int | None = None
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.decode(errors="replace")
        if line.startswith(EXIT_MARKER):
            code = int(line[len(EXIT_MARKER) :].strip() or 1)
        elif line.strip():
            sys.stdout.write(line)
            sys.stdout.flush()
    process.wait()
    if code is None:
        print("rank 0 ended without an exit status (killed?)", file=sys.stderr)
        return 1
    return code
