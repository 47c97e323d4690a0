"""pytest's settings for the whole test run, here beside pyproject.toml and not in notebooks/ (whose every file
the classroom hands to each student): the stored notebooks' kernels under nbval (the README's test command).

A notebook's kernel is a new process that binds five TCP ports the test run picked for it. With two pytest workers
starting kernels at the same moment, another process can take one of those ports in between: that kernel dies
before it answers, and every cell of its notebook errors without having run (jupyter_client's known race; seen
once here in a full run, and not again on the same notebook). Starting it again is what a person would do: up to
three starts, each failure said on the test log, so a kernel that cannot start at all still fails the notebook.
"""
import logging

import nbval.kernel

STARTS = 3
_start_new_kernel = nbval.kernel.start_new_kernel


def start_new_kernel(*args, **kwargs):
    for attempt in range(1, STARTS + 1):
        try:
            return _start_new_kernel(*args, **kwargs)
        except RuntimeError:
            if attempt == STARTS:
                raise
            logging.getLogger("nbval").warning("a notebook's kernel died while starting (start %d of %d): starting "
                                               "it again", attempt, STARTS)


nbval.kernel.start_new_kernel = start_new_kernel
