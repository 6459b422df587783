"""tests/zygote.py: a program forked from the zygote behaves as the same program run by the interpreter.

make test's workers and the docs' snippets run this way, so what they check is only as true as this: each case
runs a program both ways and compares what a caller sees (output, exit status, files, signals).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests import zygote
from tests.services import wait_for

#: Whether a program runs in a fork: numpy is loaded before the program imports anything.
FORKED = "import sys; print('forked' if 'numpy' in sys.modules else 'fresh')"


@pytest.fixture(scope="module")
def socket_path():
    started = zygote.Zygote(modules=("numpy",))
    assert started.wait(120), started.why()
    yield started.socket_path
    started.stop()


def both(socket_path, args, **kwargs) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """``args`` run by the interpreter and through the zygote, with the same environment and input."""
    kwargs = {"capture_output": True, "text": True, "timeout": 60, **kwargs}
    real = subprocess.run([sys.executable, *args], **kwargs)
    forked = subprocess.run([*zygote.command(socket_path), *args], **kwargs)
    return real, forked


PROGRAM = """
import os, sys
print(sys.argv, os.getcwd(), __name__, sys.path[0] == ({expected_path!r} or sys.path[0]), os.environ.get("PICKED"))
print(sys.stdin.read().upper())
print(type(__loader__).__name__ if not isinstance(__loader__, type) else __loader__.__name__,
      getattr(__spec__, "name", None))
sys.exit(3)
"""


def test_a_script_a_command_and_a_module_see_what_the_interpreter_gives_them(socket_path, tmp_path):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM.format(expected_path=str(tmp_path)))
    (tmp_path / "program_module.py").write_text(PROGRAM.format(expected_path=str(tmp_path)))
    env = {**os.environ, "PICKED": "yes"}
    for args in ([str(script), "one", "two"], ["-c", PROGRAM.format(expected_path=""), "one"],
                 ["-m", "program_module", "one"], ["-u", "-B", str(script)]):
        real, forked = both(socket_path, args, cwd=tmp_path, env=env, input="some input\n")
        assert real.returncode == forked.returncode == 3, (args, real.stderr, forked.stderr)
        assert forked.stdout == real.stdout and "SOME INPUT" in real.stdout, args
        assert forked.stderr == real.stderr == "", args


def test_exits_tracebacks_and_signals_are_the_interpreters(socket_path, tmp_path):
    cases = {
        "import sys; sys.exit('bye')": 1,
        "raise ValueError('boom')": 1,
        "import os, signal; os.kill(os.getpid(), signal.SIGTERM)": -signal.SIGTERM,
        "raise KeyboardInterrupt": -signal.SIGINT,
        "import os; os._exit(7)": 7,
    }
    for code, status in cases.items():
        real, forked = both(socket_path, ["-c", code], cwd=tmp_path)
        assert real.returncode == forked.returncode == status, (code, real.returncode, forked.returncode)
        assert forked.stderr == real.stderr, code  # the traceback names the program, not tests/zygote.py
    missing = tmp_path / "missing.py"
    real, forked = both(socket_path, [str(missing)])
    assert real.returncode == forked.returncode == 2 and forked.stderr == real.stderr


def test_threads_atexit_and_unclosed_files_finish_as_at_the_interpreters_exit(socket_path, tmp_path):
    code = (
        "import atexit, threading, time, sys\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))).start()\n"
        "unclosed = open(sys.argv[1], 'w'); unclosed.write('kept')\n"
        "class Noisy:\n"
        "    def __del__(self): print('finalized')\n"
        "noisy = Noisy()\n"
    )
    outputs = []
    for command in ([sys.executable], zygote.command(socket_path)):
        target = tmp_path / f"unclosed{len(outputs)}.txt"
        done = subprocess.run([*command, "-c", code, str(target)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
        assert target.read_text() == "kept"
    assert outputs[0] == outputs[1] == "thread done\natexit ran\nfinalized\n"


def test_a_fork_has_loaded_only_the_zygotes_modules_and_draws_its_own_random_numbers(socket_path):
    code = ("import sys, numpy; print('advmon' in sys.modules, 'tests' in sys.modules, 'torch' in sys.modules); "
            "print(numpy.random.random())")
    first = subprocess.run([*zygote.command(socket_path), "-c", code], capture_output=True, text=True, timeout=60)
    second = subprocess.run([*zygote.command(socket_path), "-c", code], capture_output=True, text=True, timeout=60)
    assert first.stdout.splitlines()[0] == "False False False"
    assert first.stdout.splitlines()[1] != second.stdout.splitlines()[1]  # not the zygote's generator state


def test_what_would_load_differently_runs_in_a_fresh_interpreter(socket_path):
    run = zygote.command(socket_path)
    same = subprocess.run([*run, "-c", FORKED], capture_output=True, text=True, timeout=60)
    assert same.stdout == "forked\n"
    for env in ({**os.environ, "OMP_NUM_THREADS": "3"}, {**os.environ, "PYTHONWARNINGS": "error"}):
        done = subprocess.run([*run, "-c", FORKED], capture_output=True, text=True, timeout=60, env=env)
        assert done.stdout == "fresh\n", env
    done = subprocess.run([*run, "-X", "dev", "-c", FORKED], capture_output=True, text=True, timeout=60)
    assert done.stdout == "fresh\n"
    assert zygote.command("") == [sys.executable]  # no zygote: the interpreter itself


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_killed_caller_takes_its_program_with_it(socket_path, tmp_path):
    marker = tmp_path / "pid"
    code = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    caller = subprocess.Popen([*zygote.command(socket_path), "-c", code])
    program = int(wait_for(lambda: marker.exists() and marker.read_text(), 30, "the program's pid"))
    caller.kill()
    caller.wait(10)
    wait_for(lambda: _gone(program), 10, f"program {program} to end with its killed caller")
