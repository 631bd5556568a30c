"""A caller of launch() for tests/test_launch.py: it runs ``hang.py`` with both ranks hanging
(writing their pids to ``READY_DIR``) until a signal ends it, from the main thread or, with
``--thread``, from another thread (where launch() installs no signal handler). With
``--slow-to-die`` it runs ``slow_to_die.py`` instead: plain workers that ignore SIGTERM.

SIGTERM and SIGHUP start at their defaults, as in a terminal (the test runner may run under
``nohup``, which would pass SIGHUP on ignored).
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from gradaccum_course.launch import launch

HANG = str(Path(__file__).resolve().with_name("hang.py"))
SLOW_TO_DIE = str(Path(__file__).resolve().with_name("slow_to_die.py"))


def main() -> None:
    """Call launch() on two hanging ranks, in the main thread or (``--thread``) another."""
    parser = argparse.ArgumentParser(prog="caller.py")
    parser.add_argument("--ready-dir", required=True)
    parser.add_argument("--thread", action="store_true")
    parser.add_argument("--slow-to-die", action="store_true")
    arguments = parser.parse_args()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)

    def run() -> None:
        if arguments.slow_to_die:
            launch(SLOW_TO_DIE, ["--ready-dir", arguments.ready_dir], timeout_seconds=300)
        else:
            launch(HANG, ["--ready-dir", arguments.ready_dir, "--hang-ranks", "0,1"],
                   timeout_seconds=300)

    if arguments.thread:
        runner = threading.Thread(target=run, name="launch")
        runner.start()
        runner.join()
    else:
        run()


if __name__ == "__main__":
    main()
