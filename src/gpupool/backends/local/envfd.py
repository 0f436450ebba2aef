"""How a member's environment reaches it without passing through anything the server runs as root.

Everything between the server and a member's own command (the run wrapper, systemd-run, the environment builder,
bubblewrap, setpriv, podman) runs as root, and each reads its environment: the dynamic loader (LD_*), glibc
(GCONV_PATH, LOCPATH), shells (IFS, ENV) and podman (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, ...) all take
code or configuration from it. A deny-list of names is a list of what is known today. So those tools start with
ROOT_ENV, fixed by the server, and the member's variables travel as data: JSON in a sealed memfd (never in argv,
which every user of the host may read), read by the last step before the member's command (`loader`), which runs
as the member's identity, inside its sandbox, and closes the descriptor before anything of the member's runs.
"""

from __future__ import annotations

from gpupool.backends.local.envs import loader_words, read_env, seal_env

__all__ = ["ROOT_ENV", "loader_words", "read_env", "seal_env"]

ROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
"""The whole environment of every tool the server runs as root on a member's behalf."""
