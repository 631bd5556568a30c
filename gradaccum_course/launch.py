"""torchrun from a notebook: :func:`launch` runs it (``!torchrun`` never fails a cell) and ends
the run on a timeout or an error; torchrun's agent (this module as ``__main__``) ends it should
launch()'s caller die. :func:`run_worker` is each worker's entry point: it dies with its agent.
:func:`torchrun_command` gives the command line for people."""

import contextlib
import ctypes
import faulthandler
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import psutil

from gradaccum_lib.distributed import STORE_FILE_VARIABLE
from gradaccum_lib.runtime import check_positive_int

__all__ = ["LaunchError", "LaunchTimeout", "launch", "run_worker", "torchrun_command"]

_GRACE_SECONDS, _POLL_SECONDS, _TAIL_CHARS = 2.0, 0.2, 3000
#: "RUN_ID:PID" of launch()'s agent, for its workers (a nested torchrun inherits it: the run id)
_AGENT_VARIABLE = "GRADACCUM_AGENT"
_IMPORT_PARENT = os.getppid()  # a plain torchrun worker's agent, which exports no pid
#: the agent's parent-death signal: not SIGKILL (only a handler can end plain workers' children
#: in sessions of their own), nor one that torchrun handles
_CALLER_DEATH_SIGNAL = signal.SIGUSR2
#: what torchrun's agent prints when its SIGTERM/SIGINT/SIGHUP/SIGQUIT handler stopped it
_AGENT_SIGNAL = re.compile(r"SignalException: Process \d+ got signal: (?:Signals\.)?(\w+)")
#: what a rank prints when it fails only because ANOTHER rank died (a collective broke)
_PEER_FAILURE = re.compile(r"Connection closed by peer|Connection reset by peer|Timed out "
                           r"waiting|DistNetworkError|remote worker crashing")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.DOTALL)


class LaunchError(RuntimeError):
    """torchrun failed. ``rank_stderr``: failing ranks' stderr tails; ``root_cause_rank``: the
    one that failed on its own, else first, else None; ``process_ids``: the run's processes."""

    def __init__(self, message: str, returncode: int, rank_stderr: dict[int, str],
                 root_cause_rank: int | None = None, *, process_ids: tuple[int, ...] = ()):
        super().__init__(message)
        self.returncode, self.rank_stderr = returncode, rank_stderr
        self.root_cause_rank, self.process_ids = root_cause_rank, process_ids


class LaunchTimeout(LaunchError):
    """torchrun did not finish in time; ``unfinished_ranks`` were running (stacks in stderr)."""

    def __init__(self, message: str, rank_stderr: dict[int, str], *,
                 unfinished_ranks: tuple[int, ...], process_ids: tuple[int, ...]):
        super().__init__(message, -signal.SIGKILL, rank_stderr, process_ids=process_ids)
        self.unfinished_ranks = unfinished_ranks


def launch(module: str, arguments: list[str], *, nproc_per_node: int = 2,
           timeout_seconds: float = 300.0) -> dict:
    """Return the JSON that rank 0 wrote, running ``torchrun --nproc_per_node=N -m MODULE
    ARGUMENTS --json PATH`` (``MODULE`` may be a ``.py`` script) with ``OMP_NUM_THREADS=1``, on
    loopback only; raises :class:`LaunchTimeout` or :class:`LaunchError`. No process of the run
    outlives a timeout, an error, an interrupt, this process's or the agent's death by more
    than about 2 s."""
    check_positive_int("nproc_per_node", nproc_per_node)
    if timeout_seconds <= 0:
        raise ValueError(f"timeout_seconds must be > 0; got {timeout_seconds}")
    with tempfile.TemporaryDirectory(prefix="gradaccum-launch-",
                                     ignore_cleanup_errors=True) as name:
        folder = Path(name)
        run_id = folder.name  # random; the store file's variable, unique, marks the run's processes
        environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                       "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # no TCP store for workers
                       STORE_FILE_VARIABLE: f"{run_id}:{folder / 'process_group'}"}
        for interface, addresses in psutil.net_if_addrs().items():  # the one of 127.0.0.1
            if any(address.address == "127.0.0.1" for address in addresses):
                environment.update(GLOO_SOCKET_IFNAME=interface, NCCL_SOCKET_IFNAME=interface)
        torchrun = ["--nnodes=1", f"--nproc_per_node={nproc_per_node}", "--rdzv-backend=c10d",
                    "--rdzv-conf=store_type=file", f"--rdzv-id={run_id}",
                    f"--rdzv-endpoint={folder / 'rendezvous'}", "--local-addr=127.0.0.1",
                    "--redirects=3", f"--log-dir={folder / 'logs'}",
                    f"--shutdown-timeout={_GRACE_SECONDS:g}", *_program(module), *arguments,
                    "--json", str(folder / "result.json")]
        with open(folder / "agent.log", "w") as log:  # the agent holds its own copy
            process = subprocess.Popen(
                [sys.executable, "-m", "gradaccum_course.launch", str(os.getpid()), name,
                 run_id, *torchrun], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, env=environment)
        run = _Run(folder, environment[STORE_FILE_VARIABLE], process)
        deadline = time.monotonic() + timeout_seconds
        try:
            while process.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(psutil.Error):  # record the run's processes as they start
                    for child in run.processes[process.pid].children(recursive=True):
                        run.processes.setdefault(child.pid, child)
                time.sleep(max(0.0, min(_POLL_SECONDS, deadline - time.monotonic())))
            if process.poll() is None:
                raise run.timeout_error(module, timeout_seconds)
        finally:  # also on KeyboardInterrupt: no process of the run outlives launch()
            run.end()
        if process.returncode != 0:
            raise run.exit_error(module)
        if not (folder / "result.json").is_file():
            raise LaunchError(f"torchrun {module} succeeded but rank 0 wrote no JSON", 0, {},
                              process_ids=tuple(run.processes))
        return json.loads((folder / "result.json").read_text())


def _program(module: str) -> list[str]:
    return [module] if module.endswith(".py") else ["-m", module]


def _is_alive(process: psutil.Process) -> bool:
    """Return True if ``process`` (the same one: psutil checks pid reuse) runs, zombies aside."""
    with contextlib.suppress(psutil.Error):
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    return False


def _die_with_parent(signum: int) -> None:
    if sys.platform.startswith("linux"):  # 1: PR_SET_PDEATHSIG, signum when the parent dies
        ctypes.CDLL(None).prctl(1, int(signum), 0, 0, 0)


class _Run:
    """A run: its folder, its processes' marker, its agent (None in the agent), its processes."""

    def __init__(self, folder: Path, marker: str, process: subprocess.Popen | None = None):
        self.folder, self.marker, self.process = folder, marker, process
        self.processes = {process.pid: psutil.Process(process.pid)} if process else {}

    def rank_logs(self) -> dict[int, str]:
        return {int(path.parent.name): path.read_text(errors="replace")
                for path in (self.folder / "logs").glob("**/stderr.log")
                if path.parent.name.isdigit()}

    def timeout_error(self, module: str, timeout_seconds: float) -> LaunchTimeout:
        """Dump the stacks of the ranks still running (those that handle SIGUSR1: run_worker's;
        it would kill the others), end the run; return the error naming those ranks."""
        workers, stacked = {}, []
        for process in self.processes[self.process.pid].children():  # its workers, once exec'd
            with contextlib.suppress(psutil.Error, KeyError, OSError, IndexError):
                if (environment := process.environ())["TORCHELASTIC_RUN_ID"] == self.folder.name:
                    workers[rank := int(environment["RANK"])] = process
                    caught = Path(f"/proc/{process.pid}/status").read_text().split("SigCgt:")[1]
                    if int(caught.split()[0], 16) >> (signal.SIGUSR1 - 1) & 1:  # a handled one
                        process.send_signal(signal.SIGUSR1)
                        stacked.append(rank)
        deadline = time.monotonic() + 1.0
        while stacked and time.monotonic() < deadline and not all(
                "(most recent call first)" in self.rank_logs().get(r, "") for r in stacked):
            time.sleep(0.05)
        self.end()
        unfinished = tuple(sorted(workers))
        logs = {r: log[-_TAIL_CHARS:] for r, log in self.rank_logs().items()}
        stacks = f" (the Python stacks of {sorted(stacked)} end their stderr)" if stacked else ""
        running = (f"ranks still running at the timeout: {list(unfinished)}{stacks}"
                   if logs else "no worker had started")
        details = "".join(f"\n--- rank {r} stderr (tail) ---\n{logs[r]}" for r in unfinished
                          if r in logs)
        return LaunchTimeout(f"torchrun {module} did not finish within {timeout_seconds:g} s; "
                             f"{running}; every process of the run ({len(self.processes)}) was "
                             f"killed{details}", logs, unfinished_ranks=unfinished,
                             process_ids=tuple(self.processes))

    def exit_error(self, module: str) -> LaunchError:
        """Return the error of a run that exited non-zero: its root cause, failing ranks' stderr."""
        returncode, logs = self.process.returncode, self.rank_logs()
        agent_log = (self.folder / "agent.log").read_text(errors="replace")
        tails = {r: log[-_TAIL_CHARS:] for r, log in logs.items() if log}
        failing = {r: tails[r] for r, log in logs.items() if "Traceback" in log} or tails
        agent = f"the torchrun agent (pid {self.process.pid})"
        stopped = _AGENT_SIGNAL.search(agent_log)
        if returncode < 0 or stopped:  # no rank failed on its own
            signum = str(-returncode) if returncode < 0 else stopped[1]  # torchrun: 15 or SIGTERM
            name = signal.Signals(int(signum)).name if signum.isdigit() else signum
            root, cause = None, f"{agent} was {'killed' if returncode < 0 else 'stopped'} by {name}"
        else:  # the root cause: a rank that failed on its own, else the one torchrun saw first
            own = sorted(r for r, log in failing.items() if not _PEER_FAILURE.search(log))
            first = _ROOT_CAUSE.search(agent_log)
            root = own[0] if own else (int(first[1]) if first else None)
            cause = f"first failing rank: {root}"
        details = "\n".join(f"--- rank {r} stderr (tail) ---\n{failing[r]}"
                            for r in sorted(failing, key=lambda r: (r != root, r)))
        return LaunchError(f"torchrun {module} exited with code {returncode}; {cause}; ranks with "
                           f"errors: {sorted(failing)}\n{details or agent_log[-_TAIL_CHARS:]}",
                           returncode, failing, root, process_ids=tuple(self.processes))

    def end(self) -> None:
        """SIGTERM the agent's group, each process seen or carrying the marker (its agent may
        have died unseen), SIGKILL them :data:`_GRACE_SECONDS` later, again while any is left."""
        # the agent's group only while it is unreaped: until then no process can take its pid
        group = self.process.pid if self.process and self.process.returncode is None else None

        def signal_all(signum: int) -> list[psutil.Process]:
            for process in psutil.process_iter():
                with contextlib.suppress(psutil.Error):
                    if process.environ().get(STORE_FILE_VARIABLE) == self.marker:
                        self.processes.setdefault(process.pid, process)
            with contextlib.suppress(OSError, TypeError):  # TypeError: no group
                os.killpg(group, signum)
            alive = [p for p in self.processes.values() if p.pid != os.getpid() and _is_alive(p)]
            for process in alive:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(signum)
            return alive

        alive, deadline = signal_all(signal.SIGTERM), time.monotonic() + _GRACE_SECONDS
        while any(_is_alive(p) for p in alive) and time.monotonic() < deadline:
            time.sleep(0.02)
        deadline += 5.0  # a killed process starts nothing: repeat until none is left
        while signal_all(signal.SIGKILL) and time.monotonic() < deadline:
            time.sleep(0.02)
        with contextlib.suppress(subprocess.TimeoutExpired, AttributeError):  # None: no agent
            self.process.wait(1.0)


def run_worker(main: Callable[[], int]) -> None:
    """Run a torchrun worker's ``main`` and exit with the code it returns. Under torchrun it dies
    with its agent, and SIGUSR1 prints its Python stacks (for launch())."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        run_id, _, pid = os.environ.get(_AGENT_VARIABLE, "").partition(":")
        agent = int(pid) if pid and run_id == os.environ["TORCHELASTIC_RUN_ID"] else _IMPORT_PARENT
        _die_with_parent(signal.SIGKILL)  # armed first, then the parent checked
        if os.getppid() != agent:
            sys.exit(f"torchrun agent (pid {agent}) is gone; worker {os.getpid()} exits")
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        code = main()
    except SystemExit as exit_:  # sys.exit("message"): the message to stderr, code 1, as Python
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - report any failure as the rank's traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ:
        os._exit(code)  # no finalisation, where gloo's threads can abort a finished worker
    sys.exit(code)


def torchrun_command(module: str, arguments: list[str], *, nproc_per_node: int, nnodes: int = 1,
                     rdzv_endpoint: str | None = None, rdzv_id: str = "gradaccum") -> str:
    """Return the torchrun command line for ``module`` (or a ``.py`` script) on one node
    (``--standalone``), or on each of ``nnodes`` nodes meeting at ``rdzv_endpoint`` (host:port)."""
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"nnodes and nproc_per_node must be >= 1; got {nnodes}, {nproc_per_node}")
    if nnodes > 1 and rdzv_endpoint is None:
        raise ValueError("rdzv_endpoint (host:port) is required for more than one node")
    launcher = ["--standalone"] if nnodes == 1 else [f"--nnodes={nnodes}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
    return shlex.join(["torchrun", *launcher, f"--nproc_per_node={nproc_per_node}",
                       *_program(module), *arguments])


if __name__ == "__main__":  # launch()'s agent: CALLER_PID FOLDER RUN_ID TORCHRUN_ARGUMENTS...
    caller_pid, folder, run_id, *arguments = sys.argv[1:]
    os.environ[_AGENT_VARIABLE] = f"{run_id}:{os.getpid()}"  # for its workers

    def caller_gone(*_: object) -> None:
        _Run(Path(folder), os.environ[STORE_FILE_VARIABLE]).end()
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(1)

    signal.signal(_CALLER_DEATH_SIGNAL, caller_gone)
    _die_with_parent(_CALLER_DEATH_SIGNAL)
    if os.getppid() != int(caller_pid):  # it died before the signal was armed
        caller_gone()
    from torch.distributed.run import main  # here: only the agent needs torchrun itself
    main(arguments)
