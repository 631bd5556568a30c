"""launch() under failure: no process of a run outlives it (timeout, interrupt, caller ended by
a signal or a kernel restart, torchrun's agent killed, even with the caller: nothing alive
5 s later), a timeout names the ranks that hung and carries their stacks, and more.

Each check looks at the processes of its OWN run (pids the run's workers wrote, pids launch
recorded, the test's own process tree), never at the whole machine: other runs may share it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from gradaccum_course.launch import LaunchError, LaunchTimeout, launch
from gradaccum_lib.distributed import STORE_FILE_VARIABLE

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"
HANG = str(WORKERS / "hang.py")
SLOW_TO_DIE = str(WORKERS / "slow_to_die.py")
CALLER = str(WORKERS / "caller.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="process-tree checks read Linux /proc")


def _running(pids: Iterable[int]) -> list[int]:
    """Return the pids among ``pids`` that still run (a zombie awaiting its reaper does not)."""
    running = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
    return running


def _ready_pids(ready_dir: Path, names: Iterable[str], timeout_seconds: float) -> list[int]:
    """Return the pids written to ``ready_dir/NAME`` for every name, waiting for the files."""
    deadline = time.monotonic() + timeout_seconds
    paths = [ready_dir / name for name in names]
    while not all(path.exists() and path.read_text() for path in paths):
        assert time.monotonic() < deadline, f"not ready: {sorted(os.listdir(ready_dir))}"
        time.sleep(0.05)
    return [int(path.read_text()) for path in paths]


def _wait_until_gone(pids: list[int], timeout_seconds: float) -> float:
    """Return the seconds until no pid of ``pids`` runs; fail after ``timeout_seconds``."""
    start = time.monotonic()
    while _running(pids):
        assert time.monotonic() - start < timeout_seconds, f"still running: {_running(pids)}"
        time.sleep(0.01)
    return time.monotonic() - start


def _agent_of(caller: int) -> tuple[int, Path]:
    """Return the pid of the torchrun agent that launch() started in ``caller``, and the run's
    folder (``python -m gradaccum_course.launch CALLER_PID FOLDER ...``)."""
    [agent] = [process for process in psutil.Process(caller).children()
               if "gradaccum_course.launch" in process.cmdline()]
    return agent.pid, Path(agent.cmdline()[4])


def _kill(pids: Iterable[int]) -> None:
    """SIGKILL whatever of ``pids`` still runs (a failed test's leftovers)."""
    for pid in _running(pids):
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()


def test_workers_that_ignore_sigterm_are_killed_at_the_timeout(tmp_path):
    # each rank AND its child (own session, not the agent's) ignore SIGTERM for good: 5
    # processes (torchrun's agent, 2 ranks, 2 children)
    names = ["rank-0", "rank-1", "rank-0-child", "rank-1-child"]
    start = time.monotonic()
    with pytest.raises(LaunchTimeout, match=r"did not finish within 15 s; ranks still running "
                                            r"at the timeout: \[0, 1\]; every process of the "
                                            r"run \(5\) was killed") as info:
        launch(SLOW_TO_DIE, ["--ready-dir", str(tmp_path)], timeout_seconds=15)
    seconds = time.monotonic() - start
    started = _ready_pids(tmp_path, names, 0)
    try:
        assert set(started) <= set(info.value.process_ids)  # the children were recorded too
        assert _running(info.value.process_ids) == []
        assert info.value.unfinished_ranks == (0, 1)
        assert seconds < 15 + 5  # stacks (<= 1 s), SIGTERM grace (2 s), SIGKILL: < 5 s
    finally:
        _kill(started)


def test_an_interrupted_caller_leaves_no_process(tmp_path):
    # Ctrl-C or "Interrupt kernel" in the caller: SIGINT, a KeyboardInterrupt in launch()
    caller = subprocess.Popen(
        # SIGINT's default handler, as a shell gives it: a pytest-xdist worker ignores SIGINT,
        # and a child started with it ignored never gets Python's KeyboardInterrupt handler
        [sys.executable, "-c", "import signal, sys; "
         "signal.signal(signal.SIGINT, signal.default_int_handler); "
         "from gradaccum_course.launch import launch; "
         "launch(sys.argv[1], ['--ready-dir', sys.argv[2]], timeout_seconds=120)",
         SLOW_TO_DIE, str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    started: list[int] = []
    try:
        started = _ready_pids(tmp_path, ["rank-0", "rank-1", "rank-0-child", "rank-1-child"],
                              60)
        run = [process.pid for process in psutil.Process(caller.pid).children(recursive=True)]
        assert set(started) <= set(run)
        start = time.monotonic()
        caller.send_signal(signal.SIGINT)
        _, caller_stderr = caller.communicate(timeout=30)
        assert "KeyboardInterrupt" in caller_stderr
        assert _running(run) == []
        assert time.monotonic() - start < 5  # the SIGTERM grace, then SIGKILL
    finally:
        caller.kill()
        _kill(started)


def test_workers_die_with_a_killed_agent(tmp_path):
    # a plain torchrun: only run_worker's parent-death signal can stop its workers
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         HANG, "--ready-dir", str(tmp_path), "--hang-ranks", "0,1",
         "--json", str(tmp_path / "out.json")], cwd=ROOT, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    workers: list[int] = []
    try:
        workers = _ready_pids(tmp_path, ["rank-0", "rank-1"], 60)
        assert all(psutil.Process(pid).ppid() == agent.pid for pid in workers)
        agent.kill()
        agent.wait()
        assert _wait_until_gone(workers, 10) < 10  # measured: about 0.02 s
    finally:
        agent.kill()
        agent.wait()
        _kill(workers)


#: a plain torchrun worker whose agent dies after it started, before run_worker armed the
#: parent-death signal: it waits for the test to kill the agent, then calls run_worker
_ORPHAN = """
import os, sys, time
from pathlib import Path
from gradaccum_course.launch import run_worker  # imported first, as the job's modules do
(Path(sys.argv[1]) / f"rank-{os.environ['RANK']}").write_text(str(os.getpid()))
agent = os.getppid()
while os.getppid() == agent:  # the test kills the agent now
    time.sleep(0.01)
run_worker(lambda: time.sleep(3600))
"""


def test_workers_exit_when_their_agent_died_before_run_worker(tmp_path):
    # issue 36's fault: SIGKILLed as its workers start, a plain torchrun's agent left them
    # reparented and hanging (they took the new parent for their agent)
    (tmp_path / "orphan.py").write_text(_ORPHAN)
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(tmp_path / "orphan.py"), str(tmp_path)], cwd=ROOT, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    workers: list[int] = []
    try:
        workers = _ready_pids(tmp_path, ["rank-0", "rank-1"], 60)
        agent.kill()
        agent.wait()
        seconds = _wait_until_gone(workers, 5)
        print(f"agent SIGKILLed before run_worker: workers gone in {seconds:.2f} s")
    finally:
        agent.kill()
        agent.wait()
        _kill(workers)


def test_a_worker_exits_at_once_when_its_agent_is_already_gone(tmp_path):
    # launch()'s agent tells its workers its pid: one whose parent is another process exits
    # (4194305 is above Linux's largest pid: no process has it)
    run_id = "gradaccum-test"
    worker = subprocess.run(
        [sys.executable, "-c", "from gradaccum_course.launch import run_worker; "
         "run_worker(lambda: 0)"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "TORCHELASTIC_RUN_ID": run_id,
             "GRADACCUM_AGENT": f"{run_id}:4194305"})
    assert worker.returncode == 1
    assert "torchrun agent (pid 4194305) is gone" in worker.stderr
    # and launch()'s agent whose caller is already gone starts no worker and removes the
    # run's folder
    folder = tmp_path / "run"
    folder.mkdir()
    agent = subprocess.run(
        [sys.executable, "-m", "gradaccum_course.launch", "4194305", str(folder), run_id,
         "--standalone", "--nproc_per_node=1", HANG, "--ready-dir", str(tmp_path),
         "--json", str(folder / "out.json")], cwd=ROOT, capture_output=True, text=True,
        timeout=60, env={**os.environ, STORE_FILE_VARIABLE: f"{run_id}:{folder / 'store'}"})
    assert agent.returncode == 1, agent.stderr
    assert not folder.exists() and not (tmp_path / "rank-0").exists()


def test_the_timeout_error_names_the_rank_that_hung(tmp_path):
    # rank 0 finishes, rank 1 sleeps: only rank 1 is unfinished, and its stack says where
    hang_line = next(number for number, line in enumerate(Path(HANG).read_text().splitlines(), 1)
                     if "time.sleep(3600)" in line)
    with pytest.raises(LaunchTimeout, match=r"ranks still running at the timeout: \[1\] \(the "
                                            r"Python stacks of \[1\] end their stderr\)") as info:
        launch(HANG, ["--ready-dir", str(tmp_path), "--hang-ranks", "1"], timeout_seconds=15)
    assert info.value.unfinished_ranks == (1,)
    assert (tmp_path / "rank-0").exists()
    stack = info.value.rank_stderr[1]
    assert "(most recent call first)" in stack
    assert f'hang.py", line {hang_line} in main' in stack
    assert f'hang.py", line {hang_line} in main' in str(info.value)
    assert _running(info.value.process_ids) == []


def test_a_run_listens_on_loopback_only(tmp_path):
    release = tmp_path / "release"
    result: dict = {}
    before = {process.pid for process in psutil.Process().children(recursive=True)}
    runner = threading.Thread(target=lambda: result.update(launch(
        HANG, ["--ready-dir", str(tmp_path), "--process-group", "--release", str(release)],
        timeout_seconds=60)))
    runner.start()
    run: list[psutil.Process] = []
    try:
        _ready_pids(tmp_path, ["rank-0", "rank-1"], 60)  # both ranks joined the process group
        run = [process for process in psutil.Process().children(recursive=True)
               if process.pid not in before]  # torchrun's agent, the workers
        assert len(run) == 3
        listening = {process.pid: {(connection.laddr.ip, connection.laddr.port)
                                   for connection in process.net_connections("inet")
                                   if connection.status == psutil.CONN_LISTEN}
                     for process in run}
        addresses = {ip for sockets in listening.values() for ip, _ in sockets}
        assert addresses == {"127.0.0.1"}, listening  # gloo's; no TCP store on any interface
    finally:
        release.touch()
        runner.join(60)
    assert result == {"world_size": "2"}
    assert _running(process.pid for process in run) == []


def test_a_timeout_before_any_worker_started_says_so():
    with pytest.raises(LaunchTimeout, match=r"within 0.3 s; no worker had started; every "
                                            r"process of the run \([12]\) was killed") as info:
        launch(HANG, ["--ready-dir", "unused"], timeout_seconds=0.3)
    assert info.value.unfinished_ranks == ()
    assert _running(info.value.process_ids) == []


@pytest.mark.parametrize("signum, thread", [(signal.SIGTERM, False), (signal.SIGHUP, False),
                                            (signal.SIGKILL, False), (signal.SIGTERM, True)],
                         ids=["SIGTERM", "SIGHUP", "SIGKILL", "SIGTERM-launch-in-a-thread"])
def test_a_caller_ended_by_a_signal_leaves_no_process(tmp_path, signum, thread):
    # a CI timeout, a closed terminal (SIGHUP), a killed caller: the run dies with it
    caller = subprocess.Popen([sys.executable, CALLER, "--ready-dir", str(tmp_path),
                               *(["--thread"] if thread else [])], cwd=ROOT)
    started: list[int] = []  # the workers
    try:
        started = _ready_pids(tmp_path, ["rank-0", "rank-1"], 60)
        run = [process.pid for process in psutil.Process(caller.pid).children(recursive=True)]
        assert set(started) < set(run) and len(run) == 3  # the agent and both workers
        folder = _agent_of(caller.pid)[1]
        caller.send_signal(signum)
        seconds = _wait_until_gone(run, 5)
        print(f"{signal.Signals(signum).name} (thread: {thread}): run gone in {seconds:.2f} s")
        assert caller.wait(30) == -signum
        assert not folder.exists()  # the agent removed it
    finally:
        caller.kill()
        caller.wait()
        _kill(started)


@pytest.mark.parametrize("slow_to_die", [False, True], ids=["hang", "slow-to-die"])
def test_restarting_the_kernel_leaves_no_process(tmp_path, slow_to_die):
    # Jupyter's "Restart kernel": SIGINT then SIGKILL to the kernel; its run dies with it,
    # within 5 s even when the workers (plain, no run_worker) and their children ignore SIGTERM
    manager = pytest.importorskip("jupyter_client.manager").KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(ROOT), env={**os.environ, "OMP_NUM_THREADS": "1"})
    client, started = manager.client(), []
    names = ["rank-0", "rank-1", *(["rank-0-child", "rank-1-child"] if slow_to_die else [])]
    program = (f"{SLOW_TO_DIE!r}, ['--ready-dir', {str(tmp_path)!r}]" if slow_to_die else
               f"{HANG!r}, ['--ready-dir', {str(tmp_path)!r}, '--hang-ranks', '0,1']")
    try:
        client.start_channels()
        client.wait_for_ready(timeout=60)
        client.execute(f"from gradaccum_course.launch import launch\nlaunch({program})")
        started = _ready_pids(tmp_path, names, 60)
        kernel = manager.provisioner.process.pid
        run = [process.pid for process in psutil.Process(kernel).children(recursive=True)]
        assert set(started) < set(run)
        folder = _agent_of(kernel)[1]
        start = time.monotonic()
        manager.restart_kernel(now=True)
        _wait_until_gone(run, 5 - (time.monotonic() - start))
        print(f"kernel restart ({'slow-to-die' if slow_to_die else 'hang'}): run gone in "
              f"{time.monotonic() - start:.2f} s")
        assert not folder.exists()
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        _kill(started)


@pytest.mark.parametrize("signum, verb", [(signal.SIGKILL, "killed"), (signal.SIGTERM, "stopped")])
def test_a_dead_agent_is_named_in_the_error(tmp_path, signum, verb):
    before = signal.getsignal(signal.SIGTERM)
    with ThreadPoolExecutor(1) as runner:  # launch() in a thread installs no handler
        future = runner.submit(launch, HANG, ["--ready-dir", str(tmp_path), "--hang-ranks",
                                              "0,1"], timeout_seconds=120)
        workers = _ready_pids(tmp_path, ["rank-0", "rank-1"], 60)
        agent = psutil.Process(workers[0]).ppid()
        assert signal.getsignal(signal.SIGTERM) is before
        start = time.monotonic()
        os.kill(agent, signum)
        with pytest.raises(LaunchError, match=rf"the torchrun agent \(pid {agent}\) was {verb} "
                                              rf"by {signum.name}") as info:
            future.result(60)
        assert time.monotonic() - start < 5  # launch() returns within 5 s
    assert info.value.root_cause_rank is None
    assert _running(info.value.process_ids) == []


def test_the_store_file_is_read_only_under_the_run_launch_started(monkeypatch):
    from gradaccum_lib.distributed import STORE_FILE_VARIABLE, _store_file

    monkeypatch.setenv(STORE_FILE_VARIABLE, "run-a:/tmp/a:b/store")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert _store_file() is None  # not under torchrun
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-b")  # a torchrun inside one of its workers
    assert _store_file() is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-a")
    assert _store_file() == "/tmp/a:b/store"


@pytest.mark.parametrize("with_agent", [False, True], ids=["caller", "caller-and-agent"])
def test_a_caller_killed_hard_leaves_no_process_after_5_s(tmp_path, with_agent):
    # caller: plain workers (no run_worker) that ignore SIGTERM, and their children in
    # sessions of their own, ended by the agent (SIGTERM, its grace, SIGKILL) on the kernel's
    # parent-death signal. caller-and-agent: nothing of launch() is left to end plain
    # workers, so the workers are run_worker's, which die with their agent
    caller = subprocess.Popen([sys.executable, CALLER, "--ready-dir", str(tmp_path),
                               *([] if with_agent else ["--slow-to-die"])], cwd=ROOT)
    names = ["rank-0", "rank-1", *([] if with_agent else ["rank-0-child", "rank-1-child"])]
    run: list[int] = []
    try:
        started = _ready_pids(tmp_path, names, 60)
        run = [process.pid for process in psutil.Process(caller.pid).children(recursive=True)]
        assert set(started) < set(run)
        agent, folder = _agent_of(caller.pid)
        if with_agent:
            os.kill(agent, signal.SIGKILL)
        caller.kill()
        caller.wait()
        seconds = _wait_until_gone(run, 5)
        print(f"caller SIGKILLed (agent too: {with_agent}): run gone in {seconds:.2f} s")
        assert with_agent or not folder.exists()
    finally:
        caller.kill()
        caller.wait()
        _kill(run)


def _kill_the_agent_when_a_worker_starts(before: set[int], limit_seconds: float) -> list[int]:
    """Watch this test's own new descendants; SIGKILL the torchrun agent (a worker's parent)
    the moment its first worker exists; return the workers seen then."""
    deadline = time.monotonic() + limit_seconds
    while time.monotonic() < deadline:
        workers = []
        for process in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if process.pid not in before and "TORCHELASTIC_RUN_ID" in process.environ():
                    workers.append(process)
        if workers:
            with contextlib.suppress(psutil.Error):
                os.kill(workers[0].ppid(), signal.SIGKILL)
            return [worker.pid for worker in workers]
        time.sleep(0.005)
    raise AssertionError(f"no worker started within {limit_seconds} s")


def test_no_worker_escapes_an_agent_killed_as_it_starts_them(tmp_path):
    # plain workers, the agent SIGKILLed the moment the first one exists (before any poll of
    # launch() could record it): each one still dies, and so do the children they start
    before = {process.pid for process in psutil.Process().children(recursive=True)}
    seen: list[int] = []
    with ThreadPoolExecutor(1) as runner:
        future = runner.submit(launch, SLOW_TO_DIE, ["--ready-dir", str(tmp_path)],
                               timeout_seconds=120)
        try:
            seen = _kill_the_agent_when_a_worker_starts(before, 60)
            with pytest.raises(LaunchError, match=r"the torchrun agent \(pid \d+\) was killed "
                                                  r"by SIGKILL"):
                future.result(60)  # launch() also ends the workers it did not see start
            seconds = _wait_until_gone(seen, 5)
            late = [int(path.read_text()) for path in tmp_path.iterdir() if path.read_text()]
            assert _running(late) == []  # the pids they wrote, children included
            print(f"agent SIGKILLed at its first worker: workers gone in {seconds:.2f} s")
        finally:
            _kill(seen)
            _kill(int(path.read_text()) for path in tmp_path.iterdir() if path.read_text())


@pytest.mark.parametrize(("exit_call", "code", "stderr"), [
    ('sys.exit("refused: --epochs must be <= 1000")', 1, "refused: --epochs must be <= 1000\n"),
    ("sys.exit(3)", 3, ""), ("sys.exit()", 0, "")])
def test_run_worker_exits_as_python_does_on_sys_exit(exit_call, code, stderr):
    """A worker's sys.exit("message") prints the message and exits 1, as the interpreter does;
    a number is the exit code, and says nothing."""
    program = ("import sys\nfrom gradaccum_course.launch import run_worker\n"
               f"run_worker(lambda: {exit_call})\n")
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "TORCHELASTIC_RUN_ID")}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=environment, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (code, stderr)
