"""Test processes forked from one that has already loaded torch and the frameworks.

Every make test worker imports torch, transformers, peft, verl and TRL before it runs a test (about 14 s of CPU
each, four workers), and every docs snippet imports torch and often a framework (2-10 s each, a few dozen
snippets). On two cores that CPU is the suite's time. A *zygote* loads those modules once; each worker and each
snippet is then a fork of it, which starts as if it had imported them itself.

The zygote loads third-party modules only, never advmon or a test module, so what a test checks about advmon's
own imports and settings is what a fresh interpreter does. A forked program gets its caller's standard streams,
working directory, arguments and environment (with what the preloaded modules set in theirs, as if they had
been imported after it), a ``__main__`` of its own, and exits as Python exits (threads joined, ``atexit`` run).

    python tests/zygote.py serve SOCKET MODULE...      # the zygote: loads the modules, prints "ready"
    python -I tests/zygote.py run SOCKET -- ARGS...    # as ``python ARGS...``, forked from the zygote

A request the zygote cannot serve as the interpreter would (an option other than ``-u``, ``-B``, ``-c``, ``-m``
or a script; an environment that differs from the zygote's in what the preloaded modules read when they load,
such as ``OMP_NUM_THREADS`` or ``PYTHONPATH``) runs in a real ``python`` instead: the zygote is an accelerator,
never a difference in behaviour. ``command()`` gives the command line to use, whichever is running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

#: Environment variables read when the preloaded modules load: a request whose environment differs from the
#: zygote's in one of these runs in a fresh interpreter.
READ_AT_IMPORT = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS", "TORCH", "CUDA", "NVIDIA", "TRITON", "HF_",
                  "TRANSFORMERS", "TOKENIZERS", "RAY_", "MPL", "LD_", "NUMEXPR", "VERL", "TRL_")
#: The interpreter options a forked program honours; any other runs in a fresh interpreter.
FLAGS = {"-u", "-B"}


# --------------------------------------------------------------------------- the caller's side


def command(socket_path: str | None = None) -> list[str]:
    """The command line that stands for ``python``: the zygote's client where one runs, else this interpreter.

    ``socket_path`` is the zygote's socket; ``None`` reads it from ``TESTS_ZYGOTE`` (make test sets it).

    Example:
        >>> command("") == [sys.executable]
        True
    """
    socket_path = socket_path if socket_path is not None else os.environ.get("TESTS_ZYGOTE", "")
    if not socket_path or not os.path.exists(socket_path):
        return [sys.executable]
    return [sys.executable, "-I", os.path.abspath(__file__), "run", socket_path, "--"]


def _send(conn: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    socket.send_fds(conn, [struct.pack("!I", len(data)) + data], list(fds))


def _receive(conn: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the descriptors sent with it; ``None`` when the other side has gone."""
    head, fds, _, _ = socket.recv_fds(conn, 4, 3)
    while head and len(head) < 4:
        more = conn.recv(4 - len(head))
        if not more:
            break
        head += more
    if len(head) < 4:
        return None, fds
    size = struct.unpack("!I", head)[0]
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None, fds
        data += chunk
    return json.loads(data), fds


def run_client(socket_path: str, args: list[str]) -> None:
    """``python ARGS`` forked from the zygote; this process relays signals to it and exits as it exits."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path)
        _send(conn, {"args": args, "cwd": os.getcwd(), "env": dict(os.environ),
                     "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN}, [0, 1, 2])
        reply, _ = _receive(conn)
    except OSError:
        reply = None
    if reply is None or "pid" not in reply:  # refused, or no zygote: the interpreter itself
        conn.close()
        os.execv(sys.executable, [sys.executable, *args])
    pid = reply["pid"]

    def relay(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, relay)
    reply, _ = _receive(conn)
    if reply is None:  # the session was killed: a failure, never a success
        os._exit(127)
    status = reply["status"]
    if os.WIFSIGNALED(status):  # ended by a signal: so does this process, for its caller to see
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


# --------------------------------------------------------------------------- the zygote's side


def _options(args: list[str]) -> tuple[set[str], list[str]]:
    """The leading interpreter options a fork honours (``FLAGS``), and the arguments after them."""
    index = 0
    while index < len(args) and args[index] in FLAGS:
        index += 1
    return set(args[:index]), list(args[index:])


def _refusal(request: dict, environment: dict[str, str], loaded: dict[str, str]) -> str | None:
    """Why ``request`` must run in a fresh interpreter, or ``None`` if a fork runs it as that would.

    ``environment`` is the zygote's before it loaded its modules, ``loaded`` what loading them set in it (a
    caller that loaded them too has those values).
    """
    _, args = _options(request["args"])
    if not args or (args[0].startswith("-") and args[0] not in ("-c", "-m")):
        return f"options {request['args'][:len(request['args']) - len(args) + 1]}"
    if args[0] in ("-c", "-m") and len(args) < 2:
        return f"{args[0]} without its argument"
    theirs = request["env"]
    for name in set(theirs) | set(environment):
        if not name.startswith(READ_AT_IMPORT) or theirs.get(name) == environment.get(name):
            continue
        if name not in loaded or theirs.get(name) != loaded[name]:
            return f"environment variable {name}"
    return None


def serve(socket_path: str, modules: list[str]):
    """Load ``modules``, then fork a program for each request; returns only in a forked program (its request)."""
    import gc
    import importlib
    import select

    environment = dict(os.environ)
    for name in modules:
        importlib.import_module(name)
    # What loading the modules set in the environment, as a program that imported them would have it.
    loaded = {name: value for name, value in os.environ.items() if environment.get(name) != value}
    gc.collect()
    gc.freeze()  # the loaded objects stay out of the forks' collections: their pages stay shared

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the sessions below are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends the zygote quietly
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        conn, _ = listener.accept()
        if os.fork() != 0:
            conn.close()
            continue
        # A session: serves one request, reports how its program ended, then exits.
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the program decides what Ctrl-C does; this reports it
        request, fds = _receive(conn)
        reason = _refusal(request, environment, loaded) if request is not None else "no request"
        if reason is not None:
            sys.stderr.write(f"zygote: {request['args'][:2] if request else ''} runs in a fresh interpreter: {reason}\n")
            sys.stderr.flush()
            _send(conn, {"refused": reason})
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            conn.close()
            return request, fds, loaded
        for fd in fds:
            os.close(fd)
        _send(conn, {"pid": pid})
        ended = os.pidfd_open(pid)
        while True:
            ready, _, _ = select.select([ended, conn], [], [])
            if ended in ready:
                _, status = os.waitpid(pid, 0)
                _send(conn, {"status": status})
                os._exit(0)
            if not conn.recv(1):  # the caller has gone (killed, or timed out): so does its program
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os._exit(0)


def _standard_streams(unbuffered: bool) -> None:
    """sys.stdin, sys.stdout and sys.stderr anew over descriptors 0-2, as the interpreter makes them at start."""
    import io

    encoding, errors = sys.stdout.encoding, sys.stdout.errors

    def text(fd: int, mode: str, line_buffering: bool, stream_errors: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        if mode == "rb":
            buffer = io.BufferedReader(raw)
        else:
            buffer = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(buffer, encoding=encoding, errors=stream_errors, line_buffering=line_buffering,
                                write_through=unbuffered and mode != "rb")

    sys.stdin = sys.__stdin__ = text(0, "rb", False, errors)
    sys.stdout = sys.__stdout__ = text(1, "wb", not unbuffered and os.isatty(1), errors)
    sys.stderr = sys.__stderr__ = text(2, "wb", not unbuffered, "backslashreplace")


def become(request: dict, fds: list[int], loaded: dict[str, str]) -> None:
    """Turn this fork into ``python ARGS`` as requested, run it, and exit as the interpreter would."""
    import random
    import weakref

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(loaded)
    # As the interpreter starts: KeyboardInterrupt on SIGINT, unless the caller's process ignored it.
    signal.signal(signal.SIGINT, signal.SIG_IGN if request["sigint_ignored"] else signal.default_int_handler)
    flags, args = _options(request["args"])
    _standard_streams(unbuffered="-u" in flags)
    sys.dont_write_bytecode = sys.dont_write_bytecode or "-B" in flags
    for finalizer in list(weakref.finalize._registry):  # what the zygote made is the zygote's to clean up
        finalizer.atexit = False
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # the global generator: a fresh one per process, as at import
    try:
        _run(args)
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException as error:  # the traceback the interpreter prints: the program's frames, not these
        error = error.with_traceback(error.__traceback__.tb_next.tb_next)
        sys.excepthook(type(error), error, error.__traceback__)
        _exit(1, interrupted=isinstance(error, KeyboardInterrupt))
    _exit(code)


def _run(args: list[str]) -> None:
    """Run ``-c CODE``, ``-m MODULE`` or ``SCRIPT`` (with their arguments) in a ``__main__`` of its own."""
    import importlib.machinery
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    if args[0] == "-m":
        import runpy

        sys.argv = ["-m", *args[2:]]
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(args[1], alter_argv=True)
        return
    if args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path[0] = ""
        source, filename = args[1], "<string>"
        main.__loader__ = importlib.machinery.BuiltinImporter
    else:
        sys.argv = args
        sys.path[0] = os.path.dirname(os.path.realpath(args[0]))
        try:
            with open(args[0], "rb") as script:
                source, filename = script.read(), args[0]
        except OSError as error:
            print(f"{sys.executable}: can't open file {args[0]!r}: [Errno {error.errno}] {error.strerror}",
                  file=sys.stderr)
            raise SystemExit(2) from None
        main.__file__ = args[0]
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", filename)
    main.__spec__ = None
    exec(compile(source, filename, "exec", dont_inherit=True), main.__dict__)


def _exit_code(code) -> int:
    """The exit status ``SystemExit(code)`` gives: None 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _exit(code: int | None, interrupted: bool = False) -> None:
    """Exit as the interpreter does: non-daemon threads joined, ``atexit`` run, ``__main__``'s objects released,
    the streams flushed; then the process ends without tearing down every loaded module, which in a fork of the
    zygote (its modules' pages shared, a collection of its objects copying them) cost 6 s of CPU, not 0.1 s."""
    import atexit
    import gc
    import threading

    try:
        threading._shutdown()
    except KeyboardInterrupt:
        interrupted = True
    atexit._run_exitfuncs()
    main = vars(sys.modules["__main__"])
    for name in [name for name in main if name != "__builtins__"]:
        main[name] = None  # the program's objects finalized (files flushed and closed) as at the interpreter's exit
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:  # as the interpreter ends on an uncaught KeyboardInterrupt: by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(130 if code is None else code)


def main(argv: list[str]) -> None:
    if argv[:1] == ["run"] and len(argv) >= 3 and argv[2] == "--":
        run_client(argv[1], argv[3:])
    elif argv[:1] == ["serve"] and len(argv) >= 2:
        become(*serve(argv[1], argv[2:]))
    else:
        sys.exit("usage: zygote.py serve SOCKET MODULE... | zygote.py run SOCKET -- ARGS...")



# --------------------------------------------------------------------------- started by the suite


#: What a make test worker and a docs snippet would import themselves, heaviest first (tests/conftest.py). Modules
#: that make something of their process's own when they load are left out: AReaL replaces Python's logging tree
#: (see conftest's _logging_tree_as_found), and TRL's GRPO trainer loads W&B, whose media directory (made at
#: import, removed at exit) every fork would share and the first to exit would remove.
PRELOAD = ("numpy", "torch", "pytest", "transformers", "peft", "verl", "verl.trainer.ppo.ray_trainer", "trl",
           "datasets", "matplotlib.pyplot")


class Zygote:
    """A zygote process serving at ``socket_path`` (in a directory of its own), started now, ready on ``wait()``."""

    def __init__(self, modules: tuple[str, ...] = PRELOAD) -> None:
        import subprocess
        import tempfile

        self.directory = tempfile.mkdtemp(prefix="advmon-zygote-")
        self.socket_path = os.path.join(self.directory, "socket")
        self.log = os.path.join(self.directory, "log")
        with open(self.log, "wb") as log:  # the frameworks' import-time chatter, shown only if it fails
            self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", self.socket_path,
                                             *modules], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log)

    def wait(self, timeout: float = 300.0) -> bool:
        """Whether the zygote is ready (within ``timeout`` seconds); a zygote that failed is stopped."""
        import select

        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if ready and self.process.stdout.readline() == b"ready\n":
            return True
        self.stop()
        return False

    def why(self) -> str:
        with open(self.log, errors="replace") as log:
            return log.read()[-3000:]

    def stop(self) -> None:
        import shutil

        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        self.process.stdout.close()
        shutil.rmtree(self.directory, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
