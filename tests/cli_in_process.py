"""The `trl-ext` command run inside the test process, for the tests of its failure paths (one line on stderr, an
exit code, nothing written): ``python -m trl_ext ARGS`` is ``sys.exit(trl_ext.cli.main(ARGS))``
(trl_ext/__main__.py), so calling ``main`` checks the same code and output without paying a fresh interpreter's
imports of torch, transformers and TRL (~10 s a call on 2 cores). The command's real process start is tested where
it matters: SIGTERM and resume (test_cli_interruption.py, test_sft_recipe.py, test_engine_cli.py), the console of a
run (test_console.py), `--version` (test_package.py) and the 2-process launches (test_recipe_runs.py).
"""

import subprocess


def run_cli(capfd, *args) -> subprocess.CompletedProcess:
    """``main(args)`` with stdout and stderr captured at the file-descriptor level (what a terminal would show), as
    the CompletedProcess a subprocess run would give: ``returncode``, ``stdout``, ``stderr``."""
    from trl_ext.cli import main

    argv = [str(a) for a in args]
    capfd.readouterr()  # only this call's output
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own usage errors exit
        code = stop.code
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["trl-ext", *argv], code, out, err)
