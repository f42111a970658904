"""Which names and values are secrets: one rule for ``config.yaml``, the W&B config and the log lines.

A fixed list of key names always misses one (``private_key``, ``accessToken``, ``HF_TOKEN``...). The rule works on
the *words* of a name instead: a name is split at ``_``, ``-``, ``.``, spaces and camelCase boundaries, lowercased,
and it names a secret when

* a word is one of ``SECRET_WORDS`` (token, secret, password, ...), unless the token is a tokenizer's vocabulary
  entry (``pad_token``) or a count (``max_tokens``); or
* a word is ``key`` (or ``keys``) right after a qualifier that makes it a credential (``api``, ``private``,
  ``access``, ``secret``...), or it is glued to one (``apikey``, ``secretKey`` splits anyway); or
* for environment variables, the last word is ``key``, ``token``, ``secret`` or ``password`` (``*_KEY``,
  ``*_TOKEN``, ``*_SECRET``: the convention of every cloud and model hub);

and it does not name a *location* (its last word is ``dir``, ``path``, ``file``...: ``credentials_dir``,
``token_file`` hold paths, which are kept). Values are secrets too when an environment variable that names a
secret holds them (wherever they appear, e.g. inside a URL), and the password of a ``scheme://user:password@host``
URL always is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"

SECRET_WORDS = frozenset({
    "secret", "secrets", "token", "tokens", "password", "passwords", "passwd", "passphrase", "apikey",
    "apikeys", "privatekey", "accesskey", "secretkey", "authorization", "cookie", "cookies", "credential",
})
KEY_QUALIFIERS = frozenset({
    "api", "private", "secret", "access", "auth", "signing", "encryption", "ssh", "client", "session", "master",
    "license", "account", "service", "subscription", "openai", "wandb", "hf",
})
LOCATION_WORDS = frozenset({"dir", "dirs", "path", "paths", "file", "files", "folder", "root", "filename"})
# ``pad_token``, ``eos_token``... are a tokenizer's vocabulary entries; ``max_tokens``, ``num_tokens`` are counts.
NOT_SECRET_BEFORE_TOKEN = frozenset({
    "pad", "eos", "bos", "unk", "mask", "sep", "cls", "image", "video", "vision", "audio", "start", "end", "max",
    "min", "num", "n", "total", "text", "special", "prompt", "context", "input", "output", "prefix", "register",
})
ENV_SECRET_LAST_WORDS = frozenset({"key", "token", "secret", "password", "passwd"})  # not PWD: the shell's folder
MIN_SUBSTRING_SECRET = 8  # shorter secret values are redacted only as whole values (never inside other text)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):(?P<password>[^/\s@]+)@")


def name_words(name: str) -> list[str]:
    """``"awsSecretAccessKey"`` -> ``["aws", "secret", "access", "key"]``; ``"HF_TOKEN"`` -> ``["hf", "token"]``."""
    words: list[str] = []
    for part in _SEPARATORS.split(str(name)):
        words += [w.lower() for w in _CAMEL.split(part) if w]
    return words


def is_secret_name(name: str, environment: bool = False) -> bool:
    """Whether a config key or (``environment=True``) a variable's name names a secret (the rule above)."""
    words = name_words(name)
    if not words or words[-1] in LOCATION_WORDS:
        return False
    if environment and words[-1] in ENV_SECRET_LAST_WORDS:
        return True
    for index, word in enumerate(words):
        before = words[index - 1] if index else ""
        if word in ("token", "tokens") and before in NOT_SECRET_BEFORE_TOKEN:
            continue
        if word in SECRET_WORDS:
            return True
        if word in ("key", "keys") and before in KEY_QUALIFIERS:
            return True
    return False


def secret_values(environ: Mapping[str, str] | None = None) -> set[str]:
    """The values of the environment variables that name secrets (``WANDB_API_KEY``, ``HF_TOKEN``, ...)."""
    environ = os.environ if environ is None else environ
    return {value for name, value in environ.items() if value and is_secret_name(name, environment=True)}


def redact_text(text: str, values: Iterable[str]) -> str:
    """``text`` with every secret value (long enough to be one: ``MIN_SUBSTRING_SECRET``) and every URL password
    replaced by ``REDACTED``; a short value only when it is the whole text."""
    values = set(values)
    if text in values:
        return REDACTED
    for value in sorted((v for v in values if len(v) >= MIN_SUBSTRING_SECRET), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return _URL_PASSWORD.sub(lambda m: f"{m['head']}:{REDACTED}@", text)
