"""Signed checkpoint manifests: proof that a run directory is your own.

A checkpoint's ``manifest.json`` lists every file's size and SHA-256
(`rlshell.checkpoint.write_manifest`), which catches a damaged or altered
file but not a forger: a manifest recomputed over altered files verifies.
With a key only you hold, the manifest also carries an HMAC-SHA256 of its
file list (Python's ``hmac``), and every load checks it before it reads a
byte of the checkpoint:

- ``RLSHELL_SIGNING_KEY=/path/to/key``: where the key is (a file of at least
  32 bytes, readable by you alone). Saves sign with it; every load
  (``checkpoint.resume``, export, evaluation, ``rlshell.api.load_policy``,
  ``actor.model.checkpoint``) refuses a checkpoint that is unsigned, signed
  with another key, or whose file list was changed after signing.
- Unset: manifests are written unsigned and a signature found is not checked
  (the sizes and SHA-256s still are).

``python -m rlshell.signing keygen PATH`` writes a new key (mode 0600);
``python -m rlshell.checkpoint verify CHECKPOINT`` checks one checkpoint, its
files and its signature, with the key the variable names.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "KEY_ENV_VAR",
    "MIN_KEY_BYTES",
    "SigningError",
    "check_signature",
    "load_key",
    "signature_for",
    "write_key",
]

KEY_ENV_VAR = "RLSHELL_SIGNING_KEY"
MIN_KEY_BYTES = 32
_ALGORITHM = "hmac-sha256"


class SigningError(ValueError):
    """The signing key is unusable, or a manifest's signature does not hold."""


def load_key(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The key ``RLSHELL_SIGNING_KEY`` names, or None where it is unset; a `SigningError`
    names the file and what is wrong (missing, too short, readable by others)."""
    path_text = (os.environ if environ is None else environ).get(KEY_ENV_VAR, "")
    if not path_text:
        return None
    path = Path(path_text)
    try:
        mode = path.stat().st_mode
        key = path.read_bytes().strip()
    except OSError as error:
        raise SigningError(
            f"{KEY_ENV_VAR}={path_text}: cannot read the signing key ({error.strerror}); "
            f"make one with `python -m rlshell.signing keygen {path_text}`"
        ) from error
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SigningError(
            f"{KEY_ENV_VAR}={path_text}: the signing key is readable by others "
            f"(mode {stat.S_IMODE(mode):04o}); `chmod 600 {path_text}`"
        )
    if len(key) < MIN_KEY_BYTES:
        raise SigningError(
            f"{KEY_ENV_VAR}={path_text}: the signing key has {len(key)} bytes, fewer than "
            f"{MIN_KEY_BYTES}; make one with `python -m rlshell.signing keygen PATH`"
        )
    return key


def write_key(path: Path) -> None:
    """A new random key at ``path`` (64 hex characters), readable by its owner alone;
    refuses to overwrite a file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32) + "\n")


def key_id(key: bytes) -> str:
    """A short public name for a key (not the key): the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(b"rlshell signing key id\0" + key).hexdigest()[:16]


def _mac(key: bytes, files: Mapping[str, Any]) -> str:
    canonical = json.dumps(files, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def signature_for(key: bytes, files: Mapping[str, Any]) -> dict[str, str]:
    """The ``signature`` entry of a manifest whose ``files`` entry is ``files``."""
    return {"algorithm": _ALGORITHM, "key_id": key_id(key), "mac": _mac(key, files)}


def check_signature(manifest: Mapping[str, Any], key: bytes, where: Path) -> None:
    """Raise `SigningError` unless ``manifest`` (of the checkpoint ``where``) is signed with
    ``key`` over its file list as it stands."""
    signature = manifest.get("signature")
    if not isinstance(signature, dict):
        raise SigningError(
            f"{where} is not signed, and {KEY_ENV_VAR} asks for checkpoints signed with your "
            "key: it was written without the key, or by someone else"
        )
    if signature.get("algorithm") != _ALGORITHM:
        raise SigningError(f"{where} is signed with {signature.get('algorithm')!r}, not hmac")
    mine = key_id(key)
    if signature.get("key_id") != mine:
        raise SigningError(
            f"{where} is signed with another key (key id {signature.get('key_id')}, yours {mine})"
        )
    if not hmac.compare_digest(str(signature.get("mac", "")), _mac(key, manifest["files"])):
        raise SigningError(
            f"{where}: its manifest's signature does not match its file list (the list was "
            "changed after it was signed)"
        )


def main(argv: list[str] | None = None) -> int:
    """``python -m rlshell.signing keygen PATH``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rlshell.signing")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("keygen", help="write a new signing key").add_argument("path", type=Path)
    args = parser.parse_args(argv)
    try:
        write_key(args.path)
    except FileExistsError:
        print(f"{args.path} exists; a key is never overwritten", file=sys.stderr)
        return 1
    print(f"signing key written to {args.path}; export {KEY_ENV_VAR}={args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
