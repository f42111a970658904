"""The ``fastgen`` command: train and distill diffusion models.

Each command lives in its own module; this one wires them into one Typer app and maps failures to exit codes:
0 ok, 1 runtime failure, 2 usage or config error. Expected errors print one line; ``FASTGEN_DEBUG=1`` shows
the traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

# Plain (click) help: Typer's Rich help imports rich.markdown, rich.traceback and friends on every start, which
# alone would take `fastgen --help` past 0.3 s. fastgen prints its own errors, so nothing else is lost.
os.environ.setdefault("TYPER_USE_RICH", "0")

import typer  # noqa: E402
from fastgen.cli import check_ranks as check_ranks_cmd  # noqa: E402
from fastgen.cli import convert_ckpt as convert_ckpt_cmd  # noqa: E402
from fastgen.cli import download_data as download_data_cmd  # noqa: E402
from fastgen.cli import dryrun as dryrun_cmd  # noqa: E402
from fastgen.cli import ema as ema_cmd  # noqa: E402
from fastgen.cli import encode_data as encode_data_cmd  # noqa: E402
from fastgen.cli import env as env_cmd  # noqa: E402
from fastgen.cli import eval as eval_cmd  # noqa: E402
from fastgen.cli import init as init_cmd  # noqa: E402
from fastgen.cli import profile_memory as profile_memory_cmd  # noqa: E402
from fastgen.cli import sample as sample_cmd  # noqa: E402
from fastgen.cli import train as train_cmd  # noqa: E402

app = typer.Typer(
    name="fastgen",
    help="Train diffusion models and distill them into 1-4 step generators.\n\n"
    "Quick start: `fastgen train` trains the digits recipe on CPU. `fastgen COMMAND --help` shows examples.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from fastgen import __version__

        typer.echo(f"fastgen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                           help="Show the version and exit."),
) -> None:
    """Train diffusion models and distill them into 1-4 step generators."""


train_cmd.register(app)
dryrun_cmd.register(app)
init_cmd.register(app)
env_cmd.register(app)
profile_memory_cmd.register(app)
sample_cmd.register(app)
eval_cmd.register(app)
check_ranks_cmd.register(app)
convert_ckpt_cmd.register(app)
ema_cmd.register(app)
download_data_cmd.register(app)
encode_data_cmd.register(app)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        _run(argv)
    except SystemExit as exc:
        if argv is None and _in_multi_rank_job():
            _end_rank(exc.code)
        raise


def _run(argv: list[str] | None) -> None:
    from fastgen.cli import common

    from fastgen.utils.errors import FastGenError, UsageError

    common.ARGV = hyphenated(list(sys.argv[1:] if argv is None else argv))
    debug = os.environ.get("FASTGEN_DEBUG") == "1"
    try:
        _check_urls(common.ARGV)
        try:
            # standalone_mode=False: click hands its usage errors (unknown option, bad value) to fastgen, which prints
            # them as its own one line, and returns the exit code of typer.Exit instead of exiting.
            code = app(args=common.ARGV, prog_name="fastgen", standalone_mode=False)
        except Exception as exc:  # noqa: BLE001 - click's own exceptions (typer may vendor click: matched by name)
            kinds = {cls.__name__ for cls in type(exc).__mro__}
            if "NoArgsIsHelpError" in kinds:  # `fastgen` alone (or a group without a command): the help
                exc.show()  # type: ignore[attr-defined]
                code = exc.exit_code  # type: ignore[attr-defined]
            elif "ClickException" in kinds:
                context = getattr(exc, "ctx", None)
                where = context.command_path if context is not None else "fastgen"
                raise UsageError(f"{exc.format_message()} (see `{where} --help`)") from exc  # type: ignore[attr-defined]
            elif "Abort" in kinds:
                code = 130
            else:
                raise
        code = code if isinstance(code, int) else 0
        if code == 130:  # Ctrl-C inside a command; a run that was starting has already removed what it created
            _fail("interrupted (Ctrl-C)", 130)
        sys.exit(code)
    except SystemExit:
        if argv is None:  # this process is the command (not a caller in another program): it ends now
            _freeze_for_exit()
        raise
    except FastGenError as exc:
        if debug:
            _print_traceback()  # the traceback, then the same exit code as without FASTGEN_DEBUG
        _fail(str(exc), exc.exit_code, secondary=_follows_another_rank(exc))
    except KeyboardInterrupt:
        _fail("interrupted (Ctrl-C)", 130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, exit 1
        from fastgen.utils.errors import one_line

        if debug:
            _print_traceback()
            _fail(one_line(exc), 1, secondary=_follows_another_rank(exc))
        _fail(f"{one_line(exc)} (run with FASTGEN_DEBUG=1 for the traceback)", 1,
              secondary=_follows_another_rank(exc))


def _print_traceback() -> None:
    """``FASTGEN_DEBUG=1``: the traceback of the error being handled, on stderr, before its one line. The exit code
    stays what the error's kind says (2 for usage, 1 for runtime), so a script sees the same code with and without
    debugging."""
    import traceback

    traceback.print_exc(file=sys.stderr)
    sys.stderr.flush()


# Options also accepted with underscores (torchrun's and older fastgen's spelling); --help shows the hyphenated one.
UNDERSCORE_SPELLINGS = frozenset({"--log_level", "--nproc_per_node", "--node_rank", "--rdzv_endpoint", "--rdzv_id",
                                  "--max_restarts"})


def hyphenated(argv: list[str]) -> list[str]:
    """``argv`` with the underscore spellings of options turned into the hyphenated ones the commands declare (up to
    the lone ``-`` that starts the config overrides, which are left as they are)."""
    out: list[str] = []
    for index, token in enumerate(argv):
        if token == "-":
            return out + argv[index:]
        name, sep, value = token.partition("=")
        out.append(name.replace("_", "-") + sep + value if name in UNDERSCORE_SPELLINGS else token)
    return out


def _check_urls(argv: list[str]) -> None:
    """A malformed S3 URL anywhere on the command line (an argument, an option's value, an override's value) is a
    usage error before any command runs: as a local path it would create a ``./s3:`` folder."""
    from fastgen.utils.io import check_url_form

    for token in argv:
        name, sep, value = token.partition("=")
        check_url_form(value if sep else token, name if sep else "argument")


def _in_multi_rank_job() -> bool:
    """A launcher started this process as one rank of several (``WORLD_SIZE``; read here without importing torch,
    which ``fastgen.distributed.group.launched_world_size`` needs)."""
    return os.environ.get("WORLD_SIZE", "1") not in ("", "1")


def _end_rank(code: object) -> None:
    """End a rank of a multi-rank job as the interpreter would, minus its finalization: wait for non-daemon threads,
    run the atexit handlers (logging, W&B), flush both streams, then ``os._exit``.

    Why: torch's gloo backend releases a finished collective on its own worker thread, and releasing the tensors
    it held takes the GIL. When that happens just after the main thread has started finalizing the interpreter
    (the last barrier returned, the process group was destroyed, the command ended), CPython ends the worker
    thread with ``pthread_exit``, whose unwinding through torch's ``noexcept`` destructor calls
    ``std::terminate``: the rank aborts ("terminate called without an active exception") after a run that
    succeeded. Measured with ``fastgen check-ranks`` on 2 ranks next to a busy process: 4 aborts in 80 runs
    before, none after (gdb on the cores: ``take_gil -> PyThread_exit_thread`` under
    ``ProcessGroupGloo::runLoop -> ~AsyncBarrierWork``). Nothing a rank still needs happens after atexit."""
    import atexit
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): print it as the interpreter would
        sys.stderr.write(f"{code}\n")
        status = 1
    try:
        # What the interpreter does first at exit: run the hooks registered with threading._register_atexit (they
        # stop concurrent.futures' idle workers, as inductor's compile pool has) and wait for non-daemon threads.
        # Joining the threads alone would wait forever on those idle workers.
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing left to flush
                pass
        os._exit(status)


def _freeze_for_exit() -> None:
    """The command is done: move every live object out of the garbage collector's reach before the interpreter
    shuts down. Its final collection otherwise walks the whole object graph of torch (dynamo, sympy), half a second
    per process, for objects the process is about to drop anyway; atexit handlers, finalizers and file flushes
    run as usual."""
    import gc

    gc.freeze()


def _fail(message: str, code: int, secondary: bool = False) -> None:
    """End the command with one line. A worker of a multi-rank run names its rank; one started by `fastgen ...
    --nproc-per-node` leaves the line to its launcher, which reports the rank that failed first."""
    from fastgen.cli.common import print_error

    from fastgen.distributed.group import get_rank, launched_world_size

    if launched_world_size() > 1:
        from fastgen.distributed.launch import launched, record_worker_error

        message = f"rank {get_rank()}: {message}"
        if launched() and record_worker_error(message, secondary=secondary, exit_code=code):
            sys.exit(code)
    print_error(message)
    sys.exit(code)


def _follows_another_rank(exc: BaseException) -> bool:
    """A collective that failed because a peer went away: the peer's own failure is the one to report."""
    if not _in_multi_rank_job():
        return False
    from fastgen.distributed.group import is_peer_failure

    return is_peer_failure(exc)


if __name__ == "__main__":
    main()
