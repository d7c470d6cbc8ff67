"""A pool's CA file: how the certificate authorities reach every worker job, by a name that
works there.

Workers that check the manager's certificate against a CA file (``FactoryConfig.ssl_ca``,
``vine_worker --ssl-ca``) need that file where they run. The pool copies it into its
scratch folder (:func:`stage_ca`: ``trust/manager-ca.pem``, mode 0644, readable by whoever
runs the factory, an HTCondor pool's own user too), and vine_factory ships it with every
job as a wrapper input, as it ships the password file: the job finds it in its own folder,
and ``vine_worker`` makes the name absolute when it reads its options (patch 0014), before
it moves into its workspace.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from datavine.deploy.pools.factory import FactoryConfig

CA_NAME = "manager-ca.pem"  # the CA file's name in a pool's scratch folder and in each job


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


def _trust_dir(scratch: Path) -> Path:
    folder = scratch / "trust"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    return folder
