"""Which command-line options a TaskVine program (``vine_worker``, ``vine_factory``) takes.

datavine adds options that only its TaskVine build has (``--transfer-address``: patch 0002;
``--ssl-ca``/``--ssl-fingerprint``: patch 0014); a program built without them exits 1 on
the first such option, and a worker that does not start serves no one. So whoever builds
a command line asks :func:`options_of` first: the options the program's ``--help`` lists,
read once per binary and process. :func:`unsupported` is the pure half: what a command's
options lack in that set.
"""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Iterable

HELP_TIMEOUT_S = 10.0
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")

# datavine's options beyond TaskVine as released, and the patch that brings each one
TRANSFER_ADDRESS = "--transfer-address"
SSL_CA = "--ssl-ca"
SSL_FINGERPRINT = "--ssl-fingerprint"
PATCHED_OPTIONS = {TRANSFER_ADDRESS: "0002", SSL_CA: "0014", SSL_FINGERPRINT: "0014"}


def options_in_help(text: str) -> frozenset[str]:
    """The long options (``--name``) a program's ``--help`` text names (pure)."""
    return frozenset(_OPTION.findall(text))


@functools.cache
def options_of(binary: str) -> frozenset[str]:
    """The long options ``binary --help`` lists (empty when it cannot be run: then every
    option counts as unsupported, and nothing optional is passed)."""
    try:
        done = subprocess.run([binary, "--help"], capture_output=True, text=True,
                              timeout=HELP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return options_in_help(done.stdout + done.stderr)


def option_name(argument: str) -> str:
    """``--ssl-ca=/x`` -> ``--ssl-ca`` (pure)."""
    return argument.split("=", 1)[0]


def unsupported(arguments: Iterable[str], takes: frozenset[str]) -> list[str]:
    """The options among ``arguments`` (``--name`` or ``--name=value``) not in ``takes``,
    in order, without repeats (pure)."""
    names = (option_name(a) for a in arguments if a.startswith("--"))
    return [n for n in dict.fromkeys(names) if n not in takes]
