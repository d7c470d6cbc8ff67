"""A pool's CA file: how the certificate authorities reach every worker job, by a name that
works there.

Workers that check the manager's certificate against a CA file (``FactoryConfig.ssl_ca``,
``vine_worker --ssl-ca``) need that file where they run. The pool copies it into its
scratch folder (:func:`stage_ca`: ``trust/manager-ca.pem``, mode 0644, readable by whoever
runs the factory, an HTCondor pool's own user too), and vine_factory ships it with every
job as a wrapper input, as it ships the password file: the job finds it in its own folder.

``vine_worker`` opens its ``--ssl-ca`` file when it connects, after it has moved into its
workspace, so the name the factory gives it (relative to the job's folder) would not be
found there. A small wrapper (:data:`CA_WRAPPER`, shipped with each job and run before the
worker) turns ``--ssl-ca=<name>`` into the full path in the job's folder, where the job
starts. The password file has no such problem: the worker reads it at start.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from datavine.deploy.pools.factory import FactoryConfig

CA_NAME = "manager-ca.pem"  # the CA file's name in a pool's scratch folder and in each job
CA_WRAPPER_NAME = "datavine_ca.sh"

CA_WRAPPER = f"""#!/bin/sh
# datavine: vine_worker opens its --ssl-ca file after moving into its workspace: name the CA
# file shipped with this job by its full path. Started by vine_factory as:
# {CA_WRAPPER_NAME} COMMAND ARGS...
for arg do
    shift
    case "$arg" in
        --ssl-ca=/*) ;;
        --ssl-ca=*) arg="--ssl-ca=$PWD/${{arg#--ssl-ca=}}" ;;
    esac
    set -- "$@" "$arg"
done
exec "$@"
"""


def stage_ca(cfg: FactoryConfig, scratch: Path) -> FactoryConfig:
    """``cfg`` with its CA file (``ssl_ca``) copied to ``scratch/trust/manager-ca.pem``
    (mode 0644: certificates are public, and the factory may run as another user); not in
    ``scratch`` itself, where vine_factory copies its wrapper inputs. ``cfg`` as it is
    without ``ssl_ca``."""
    if cfg.ssl_ca is None:
        return cfg
    staged = _trust_dir(scratch) / CA_NAME
    staged.unlink(missing_ok=True)
    shutil.copyfile(cfg.ssl_ca, staged)
    staged.chmod(0o644)
    return replace(cfg, ssl_ca=staged)


def write_ca_wrapper(scratch: Path) -> Path:
    """Write :data:`CA_WRAPPER` next to the staged CA file and return its path."""
    path = _trust_dir(scratch) / CA_WRAPPER_NAME
    path.write_text(CA_WRAPPER)
    path.chmod(0o755)
    return path


def _trust_dir(scratch: Path) -> Path:
    folder = scratch / "trust"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    return folder
