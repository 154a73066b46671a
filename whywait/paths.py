"""Where a whywait process keeps what it writes on a host: one rule for the agent's state folder and the
placement hooks' spool.

Called when a command starts and needs a folder it was not given.  Order: the environment variable
(what an operator set), else the system folder when it can be made and written (root, or a service
user it was made for), else a folder under the user's ``~/.cache`` (an ordinary user trying it out).
"""

from __future__ import annotations

import os


def state_folder(env_var: str, system: str, home_name: str) -> str:
    """``$env_var`` when set, else ``system`` when it can be created and written, else
    ``~/.cache/whywait/<home_name>`` (``home_name`` empty: ``~/.cache/whywait`` itself); returns the path."""
    env = os.environ.get(env_var, "").strip()
    if env:
        return env
    try:
        os.makedirs(system, exist_ok=True)
        if os.access(system, os.W_OK):
            return system
    except OSError:
        pass
    return os.path.join(os.path.expanduser("~"), ".cache", "whywait", home_name) if home_name else \
        os.path.join(os.path.expanduser("~"), ".cache", "whywait")
