"""pytest's settings for the whole test run, here beside pyproject.toml and not in notebooks/ (whose every file
the classroom hands to each student): the stored notebooks' kernels under nbval (the README's test command).

With LLMWALK_OTHER_CPU=1 (the test command sets it), each English notebook's kernel computes as another CPU would:
torch's portable kernels and numba compiled for a plain x86-64 (llmwalk_setup.OTHER_CPU); the Chinese twins run
with this CPU's own (llmwalk_setup.py says why).

A notebook's kernel is a new process that binds five TCP ports the test run picked for it. With two pytest workers
starting kernels at the same moment, another process can take one of those ports in between: that kernel dies
before it answers, and every cell of its notebook errors without having run (jupyter_client's known race; seen
once here in a full run, and not again on the same notebook). Starting it again is what a person would do: up to
three starts, each failure said on the test log, so a kernel that cannot start at all still fails the notebook.
"""
import logging
import os
from pathlib import Path

import nbval.kernel

from llmwalk_setup import OTHER_CPU

STARTS = 3
_start_new_kernel = nbval.kernel.start_new_kernel


def kernel_env(cwd: str | None) -> dict | None:
    """The environment of a notebook's kernel started in `cwd`: OTHER_CPU added for the English edition (a folder
    not under notebooks/zh) when LLMWALK_OTHER_CPU=1, else None (the kernel inherits this process's)."""
    if os.environ.get("LLMWALK_OTHER_CPU") != "1" or cwd is None or "zh" in Path(cwd).parts:
        return None
    return dict(os.environ, **OTHER_CPU)


def start_new_kernel(*args, **kwargs):
    if (env := kernel_env(kwargs.get("cwd"))) is not None:
        kwargs["env"] = env
    for attempt in range(1, STARTS + 1):
        try:
            return _start_new_kernel(*args, **kwargs)
        except RuntimeError:
            if attempt == STARTS:
                raise
            logging.getLogger("nbval").warning("a notebook's kernel died while starting (start %d of %d): starting "
                                               "it again", attempt, STARTS)


nbval.kernel.start_new_kernel = start_new_kernel
