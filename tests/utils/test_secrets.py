"""The redaction rule (fastgen.utils.secrets), tested on generated names rather than a fixed list: every spelling of
every secret word under every prefix must be caught, and names that only look similar must not."""

from __future__ import annotations

import itertools
import random

import pytest

from fastgen.configs.config_utils import redact
from fastgen.utils.secrets import REDACTED, is_secret_name, name_words, redact_text, secret_values

SECRET_CORES = [["token"], ["secret"], ["password"], ["passwd"], ["api", "key"], ["private", "key"],
                ["access", "key"], ["secret", "key"], ["auth", "token"], ["client", "secret"], ["access", "token"],
                ["session", "token"], ["secret", "access", "key"], ["api", "keys"], ["passphrase"]]
PREFIXES = [[], ["my"], ["aws"], ["hf"], ["openai"], ["wandb"], ["db", "admin"], ["s3"]]
PLAIN = [["name"], ["path"], ["credentials", "dir"], ["max", "tokens"], ["pad", "token"], ["key", "path"],
         ["token", "file"], ["input", "key"], ["latent", "key"], ["keyframes"], ["monkey"], ["tokenizer"],
         ["secret", "file"], ["api", "key", "path"], ["prompt", "tokens"], ["save", "dir"]]


def spellings(words: list[str]) -> list[str]:
    """snake_case, camelCase, PascalCase, UPPER_SNAKE, kebab-case and dotted forms of ``words``."""
    camel = words[0] + "".join(w.capitalize() for w in words[1:])
    return ["_".join(words), camel, camel[:1].upper() + camel[1:], "_".join(words).upper(), "-".join(words),
            ".".join(words)]


def generated(core: list[str]) -> list[str]:
    """Every spelling of ``core`` under every prefix."""
    return sorted({s for prefix in PREFIXES for s in spellings(prefix + core)})


@pytest.mark.parametrize("core", SECRET_CORES, ids="_".join)
def test_every_spelling_of_a_secret_name_is_a_secret(core: list[str]) -> None:
    for name in generated(core):
        assert is_secret_name(name), (name, name_words(name))
        assert redact({name: "value-0123456789"}) == {name: REDACTED}, name


@pytest.mark.parametrize("core", PLAIN, ids="_".join)
def test_names_that_only_look_like_secrets_are_kept(core: list[str]) -> None:
    for name in generated(core):
        assert not is_secret_name(name), (name, name_words(name))
        assert redact({name: "kept/value"}, secrets=set()) == {name: "kept/value"}, name


def test_environment_variables_named_like_secrets_have_their_values_redacted_anywhere() -> None:
    rng = random.Random(0)
    for stem, suffix in itertools.product(["HF", "MY_SERVICE", "GITHUB", "ANTHROPIC", "X"],
                                          ["TOKEN", "KEY", "SECRET", "API_KEY", "ACCESS_TOKEN", "PASSWORD"]):
        value = "".join(rng.choice("abcdefghijkmnpqrstuvwxyz0123456789") for _ in range(24))
        environ = {f"{stem}_{suffix}": value, "HOME": "/root", "PWD": "/work", "PATH": "/usr/bin"}
        found = secret_values(environ)
        assert found == {value}, (stem, suffix, found)
        tree = {"log_config": {"group": f"run-{value}", "url": f"https://host/?t={value}"}, "cwd": "/work/x"}
        assert redact(tree, found) == {"log_config": {"group": f"run-{REDACTED}", "url": f"https://host/?t={REDACTED}"},
                                       "cwd": "/work/x"}


def test_url_passwords_are_redacted_and_the_rest_of_the_url_kept() -> None:
    for scheme, user, password in itertools.product(["https", "s3", "postgresql+psycopg", "redis"], ["bob", "a.b-c"],
                                                    ["hunter2", "p%40ss:w0rd", "x"]):
        url = f"{scheme}://{user}:{password}@host.example:5432/db/path"
        assert redact_text(url, set()) == f"{scheme}://{user}:{REDACTED}@host.example:5432/db/path"
        assert redact({"endpoint": url}, set()) == {"endpoint": f"{scheme}://{user}:{REDACTED}@host.example:5432/db/path"}
    assert redact_text("https://host.example:8080/path", set()) == "https://host.example:8080/path"


def test_short_values_are_redacted_only_as_whole_values() -> None:
    assert redact_text("1", {"1"}) == REDACTED
    assert redact_text("iteration 1 of 10", {"1"}) == "iteration 1 of 10"


def test_log_lines_are_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import logging

    from fastgen.utils.logging import get_logger, install_handler

    monkeypatch.setenv("HF_TOKEN", "hf_0123456789abcdef")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    install_handler(handler, "INFO")
    try:
        get_logger("fastgen.test").info("downloading with %s from https://bob:hunter2@host/x", "hf_0123456789abcdef")
    finally:
        logging.getLogger("fastgen").removeHandler(handler)
    text = stream.getvalue()
    assert "hf_0123456789abcdef" not in text and "hunter2" not in text and text.count(REDACTED) == 2, text
