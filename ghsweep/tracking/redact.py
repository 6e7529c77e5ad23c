"""Secrets out of every record: MLflow params, tags and run names, run-directory files, console output.

A config key is secret when its last part contains one of SECRET_WORDS as a word of its own
(case-insensitive; words are separated by `_`, `-` or the key's start and end): `tracking.password`,
`model.hf_token`, `container.env.AWS_SECRET_ACCESS_KEY`, `db.api_key`, `site.credentials`; not
`container.env.TOKENIZERS_PARALLELISM` or `tokens_per_s`. Its value is recorded as `***`.

Redaction works on structure, never on values: a config or its params by key (inside lists too), an
override by its key, free text (log lines, the command line, run names, errors) where it holds a
secret key's `key=value` / `key: value` pair or a URI's password (`scheme://user:PASSWORD@host`). Text
that is not a secret's own field is never rewritten, however short the secret (`+db.password=2026`
leaves `2026-11-25` in a sweep's name alone). The worker still reads the real values from its run
directory's config.yaml, which only the user can read; environment variables are never logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

SECRET_WORDS = ("password", "passwd", "token", "secret", "api_key", "apikey", "credential", "credentials")
REDACTED = "***"
_SECRET_KEY = re.compile(rf"(^|[_-])({'|'.join(SECRET_WORDS)})($|[_-])", re.IGNORECASE)
# Hydra's override prefixes: add, force-add, delete.
_OVERRIDE = re.compile(r"^(?P<prefix>\+\+|\+|~)?(?P<key>[^=]+)=(?P<value>.*)$", re.DOTALL)
# A key and its value in free text: `db.password=x` (an override: the value runs to the next space), or
# `password: x` / `'password': 'x'` / `{password:x}` (YAML, JSON, a dict, Hydra's dict syntax: to the
# next separator). Quoted values are taken whole.
_QUOTED = r"'[^'\n]*'|\"[^\"\n]*\""
_WORD = r"[A-Za-z0-9]+"
_SECRET_PART = rf"(?:{_WORD}[_-])*(?:{'|'.join(SECRET_WORDS)})(?:[_-]{_WORD})*"
_PAIR = re.compile(
    rf"(?<![\w.\-])(?P<key>(?:[\w\-]+\.)*{_SECRET_PART})(?![\w\-])(?P<close>['\"]?)"
    rf"(?:(?P<eq>=)(?P<v1>{_QUOTED}|[^\s'\"]+)|(?P<colon>[ \t]*:[ \t]*)(?P<v2>{_QUOTED}|[^\s,}}\]'\"]+))",
    re.IGNORECASE,
)
# The password of a URI's userinfo: scheme://user:PASSWORD@host.
# Hydra's override_dirname escapes the colons (`http\\://alice\\:PASS@host`).
_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][\w+.\-]*\\?://[^\s:/@\\]*\\?:)(?P<password>[^\s/@]+)@")


# A key ending in an id names a thing rather than holding a secret (a tokenizer's bos_token_id).
_ID = re.compile(r"[_-]ids?$", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    """True for a (dotted) config key whose last part names a secret."""
    last = str(key).rsplit(".", 1)[-1]
    return bool(_SECRET_KEY.search(last)) and not _ID.search(last)


def _pair(match: re.Match) -> str:
    value = match["v1"] or match["v2"]
    if not is_secret_key(match["key"]) or value.strip("'\"") == REDACTED:
        return match[0]
    if match["eq"]:
        return f"{match['key']}{match['close']}={REDACTED}"
    return f"{match['key']}{match['close']}{match['colon']}{REDACTED}"


def text(value: str) -> str:
    """Free text with the values of secret keys' pairs and URIs' passwords replaced by ***."""
    return _PAIR.sub(_pair, _USERINFO.sub(rf"\g<head>{REDACTED}@", value))


def override(item: str) -> str:
    """`+tracking.password=hunter2` -> `+tracking.password=***` (a sweep list's values too); the value
    of any other override through text() (a list or dict holding a secret key, a URI's password)."""
    match = _OVERRIDE.match(item)
    if not match:
        return text(item)
    if is_secret_key(match["key"]):
        return f"{match['prefix'] or ''}{match['key']}={REDACTED}"
    return f"{match['prefix'] or ''}{match['key']}={text(match['value'])}"


def overrides(items: Iterable[str]) -> list[str]:
    return [override(i) for i in items]


def run_name(name: str) -> str:
    """A run name made of comma-joined overrides (Hydra's override_dirname)."""
    return text(name)


def params(flat: Mapping[str, Any]) -> dict[str, str]:
    return {k: REDACTED if is_secret_key(k) else text(str(v)) for k, v in flat.items()}


def config(tree: Any) -> Any:
    """A plain (nested dict/list) config with the values of secret keys replaced, in lists too."""
    if isinstance(tree, Mapping):
        return {k: REDACTED if is_secret_key(k) and not isinstance(v, Mapping) else config(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [config(v) for v in tree]
    return text(tree) if isinstance(tree, str) else tree


_installed = False


def install_log_redaction() -> None:
    """Every log record of this process, whoever logs it (Hydra's launcher prints each job's
    overrides, MLflow its 'View run at' URL), is redacted when it is made: a record factory survives
    Hydra reconfiguring the handlers for each job, which handler filters would not."""
    global _installed
    if _installed:
        return
    make_record = logging.getLogRecordFactory()

    def redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            record.msg, record.args = text(record.getMessage()), ()
        except (TypeError, ValueError):  # a malformed record: logging reports it when it is emitted
            pass
        return record

    logging.setLogRecordFactory(redacting_factory)
    _installed = True
