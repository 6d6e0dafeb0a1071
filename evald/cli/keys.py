"""``evald keys DIR``: an evald and a trainer CURVE key pair, sorted into one directory per host, and the
secret an eval group over several hosts shares (``DIR/group.key``).

The key-file rules (0600 secrets in 0700 directories, nothing overwritten) are in
evald.contracts.auth; this module only arranges the files and explains where they go.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from evald.contracts.auth import (ENV_ALLOWED_KEYS, ENV_CLIENT_KEY, ENV_SERVER_KEY, ENV_SERVER_PUBLIC_KEY,
                                  GROUP_KEY_FILE, HOOK_CLIENT_KEY, HOOK_SERVER_PUBLIC_KEY, OPT_ALLOWED_KEYS,
                                  OPT_SERVER_KEY, SecurityError, _private_dir, generate_keypair, write_group_key)

_INSTRUCTIONS = f"""Created CURVE keys (secret files 0600, directories 0700).
Copy {{server_key.parent}}/ to the host that runs evald:
  {{server_key}}   evald's SECRET key -> evald {OPT_SERVER_KEY} / {ENV_SERVER_KEY}
  {{allowed_keys}}/   trainer public keys -> evald {OPT_ALLOWED_KEYS} / {ENV_ALLOWED_KEYS}
Copy {{client_key.parent}}/ to every host that runs training ranks:
  {{client_key}}   trainer's SECRET key -> hook {HOOK_CLIENT_KEY}= / {ENV_CLIENT_KEY}
  {{server_public_key}}   evald's public key -> hook {HOOK_SERVER_PUBLIC_KEY}= / {ENV_SERVER_PUBLIC_KEY}
For an eval group over several hosts, copy to every one of them:
  {{group_key}}   the group's SECRET -> evald --group '{{{{"key_file": "..."}}}}' (docs/eval-group.md)
Use scp/rsync over ssh; keep secret files 0600 and on their host. More: docs/authentication.md"""


def create_key_bundles(directory: str | os.PathLike) -> dict[str, Path]:
    """An evald (server) and a trainer (client) pair, sorted into one directory per host."""
    root = Path(directory)
    evald_host, trainer_host = root / "evald-host", root / "trainer-host"
    if evald_host.exists() or trainer_host.exists() or os.path.lexists(root / GROUP_KEY_FILE):
        raise FileExistsError(f"{root} already holds keys; refusing to overwrite them (pick a new DIR)")
    _private_dir(root)
    evald_public, evald_secret = generate_keypair(evald_host, "evald")
    trainer_public, trainer_secret = generate_keypair(trainer_host, "trainer")
    _private_dir(evald_host / "allowed")
    os.replace(evald_public, trainer_host / evald_public.name)
    os.replace(trainer_public, evald_host / "allowed" / trainer_public.name)
    group_key = write_group_key(root / GROUP_KEY_FILE)
    return {"server_key": evald_secret, "allowed_keys": evald_host / "allowed",
            "client_key": trainer_secret, "server_public_key": trainer_host / evald_public.name,
            "group_key": group_key}


def keys_command(directory: str) -> int:
    """``evald keys DIR``: create both key pairs and print which file goes to which host."""
    try:
        made = create_key_bundles(directory)
    except (OSError, SecurityError) as exc:
        print(f"evald keys: {exc}", file=sys.stderr)
        return 1
    print(_INSTRUCTIONS.format(**made))
    return 0
