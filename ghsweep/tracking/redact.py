"""Secrets out of every record: MLflow params, tags and run names, run-directory files, console output.

A config key is secret when its last part contains one of SECRET_WORDS as a word of its own
(case-insensitive; words are separated by `_`, `-` or the key's start and end): `tracking.password`,
`model.hf_token`, `container.env.AWS_SECRET_ACCESS_KEY`, `db.api_key`, `site.credentials`; not
`container.env.TOKENIZERS_PARALLELISM` or `tokens_per_s`. Its value is recorded as `***`.

Structured records (params, overrides, configs) are redacted by key. Free text (log lines, the
command line, run names, errors) is redacted by value: the values of secret keys this process has
seen (`remember`) are replaced wherever they appear. The worker still reads the real values from
its run directory's config.yaml, which only the user can read; environment variables are never logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.base import DictKeyType

SECRET_WORDS = ("password", "passwd", "token", "secret", "api_key", "apikey", "credential", "credentials")
REDACTED = "***"
_SECRET_KEY = re.compile(rf"(^|[_-])({'|'.join(SECRET_WORDS)})($|[_-])", re.IGNORECASE)
# Hydra's override prefixes: add, force-add, delete.
_OVERRIDE = re.compile(r"^(?P<prefix>\+\+|\+|~)?(?P<key>[^=]+)=(?P<value>.*)$", re.DOTALL)

_secret_values: set[str] = set()


def is_secret_key(key: str) -> bool:
    """True for a (dotted) config key whose last part names a secret."""
    return bool(_SECRET_KEY.search(str(key).rsplit(".", 1)[-1]))


def _remember_value(value: str) -> None:
    if value and value != REDACTED:
        _secret_values.add(value)


def remember(cfg: DictConfig | Mapping, overrides: Iterable[str] = ()) -> None:
    """Note the secret values of a config (resolved, the `hydra` node left out) and of command-line
    overrides (a sweep list such as `+db.password=a,b` gives each of its values), so free text
    that carries them is redacted from now on in this process."""
    for key in cfg:
        if key != "hydra":
            for name, leaf in _leaves(_plain(cfg, key), str(key)):
                if is_secret_key(name) and leaf is not None and not isinstance(leaf, bool):
                    _remember_value(str(leaf))
    for item in overrides:
        match = _OVERRIDE.match(item)
        if match and is_secret_key(match["key"]):
            _remember_value(match["value"])
            for value in match["value"].split(","):
                _remember_value(value)
    _install_log_redaction()


def _plain(cfg: DictConfig | Mapping, key: DictKeyType) -> Any:
    """cfg[key] as plain data, resolved where it resolves (an unset environment variable does not)."""
    if not isinstance(cfg, DictConfig):
        return cfg[key]
    node = cfg._get_node(key)
    for resolve in (True, False):
        try:
            # A DictConfig's container is a dict (the stubs allow any container).
            plain = cast("dict[str, Any]", OmegaConf.to_container(OmegaConf.create({"v": node}), resolve=resolve))
            return plain["v"]
        except Exception:  # noqa: BLE001 - an interpolation that fails now fails in the run, with its own error
            continue
    return None


def _leaves(value: Any, name: str) -> Iterable[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key, child in value.items():
            yield from _leaves(child, f"{name}.{key}")
    else:
        yield name, value


def text(value: str) -> str:
    """Free text with every remembered secret value replaced by ***; longest first, so a value that
    contains another is replaced whole."""
    for secret in sorted(_secret_values, key=len, reverse=True):
        value = value.replace(secret, REDACTED)
    return value


def override(item: str) -> str:
    """`+tracking.password=hunter2` -> `+tracking.password=***`; other overrides through text()."""
    match = _OVERRIDE.match(item)
    if match and is_secret_key(match["key"]):
        return f"{match['prefix'] or ''}{match['key']}={REDACTED}"
    return text(item)


def overrides(items: Iterable[str]) -> list[str]:
    return [override(i) for i in items]


def run_name(name: str) -> str:
    """A run name made of comma-joined overrides (Hydra's override_dirname)."""
    return ",".join(override(part) for part in text(name).split(","))


def params(flat: Mapping[str, Any]) -> dict[str, str]:
    return {k: REDACTED if is_secret_key(k) else text(str(v)) for k, v in flat.items()}


def config(tree: Any) -> Any:
    """A plain (nested dict/list) config with the values of secret keys replaced."""
    if isinstance(tree, Mapping):
        return {k: REDACTED if is_secret_key(k) and not isinstance(v, Mapping) else config(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [config(v) for v in tree]
    return text(tree) if isinstance(tree, str) else tree


_installed = False


def _install_log_redaction() -> None:
    """Every log record of this process, whoever logs it (Hydra's launcher prints each job's
    overrides), is redacted when it is made: a record factory survives Hydra reconfiguring the
    handlers for each job, which handler filters would not."""
    global _installed
    if _installed:
        return
    make_record = logging.getLogRecordFactory()

    def redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        if _secret_values:
            try:
                record.msg, record.args = text(record.getMessage()), ()
            except (TypeError, ValueError):  # a malformed record: logging reports it when it is emitted
                pass
        return record

    logging.setLogRecordFactory(redacting_factory)
    _installed = True
