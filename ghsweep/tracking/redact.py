"""Secrets out of every record: MLflow params, tags and run names, run-directory files, console output,
a tuning study's storage and reports.

A config key is secret when its last part, split into words (at `_`, `-`, `.` and camelCase; lower
case; a plural made singular), holds one of SECRET_WORDS or SECRET_PAIRS: `tracking.password`,
`db.passwords`, `model.hf_token`, `x.accessToken`, `x.clientSecret`, `container.env.AWS_SECRET_ACCESS_KEY`,
`db.api_key`, `x.apiKey`, `ssh.private_key`, `db.pwd`, `gpg.passphrase`, `site.credentials`; not
`container.env.TOKENIZERS_PARALLELISM`, `tokens_per_s` or `data.mean_tokens` (here `tokens` counts
tokens), nor a key ending in an id (`bos_token_id` names a token). Its value is recorded as `***`.

Redaction works on structure, never on values: a config or its params by key (inside lists too), an
override by its key, free text (log lines, the command line, run names, errors) where it holds a
secret key's `key=value` / `key: value` pair or a URI's password (`scheme://user:PASSWORD@host`; the
userinfo ends at the last `@` before the host, so a password holding `@` is hidden whole). Text
that is not a secret's own field is never rewritten, however short the secret (`+db.password=2026`
leaves `2026-11-25` in a sweep's name alone). The worker still reads the real values from its run
directory's config.yaml, which only the user can read; environment variables are never logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

SECRET_WORDS = ("password", "passwd", "pwd", "passphrase", "token", "secret", "apikey", "credential")
# Two words that name a secret together, though neither does alone.
SECRET_PAIRS = (("api", "key"), ("private", "key"), ("access", "key"))
# Plurals that count here rather than hold secrets: `tokens_per_s`, `data.mean_tokens`.
COUNTING_PLURALS = ("tokens",)
REDACTED = "***"
# Hydra's override prefixes: add, force-add, delete.
_OVERRIDE = re.compile(r"^(?P<prefix>\+\+|\+|~)?(?P<key>[^=]+)=(?P<value>.*)$", re.DOTALL)
# A key and its value in free text: `db.password=x` (an override: the value runs to the next space), or
# `password: x` / `'password': 'x'` / `{password:x}` (YAML, JSON, a dict, Hydra's dict syntax: to the
# next separator). Quoted values are taken whole. A key is taken when it holds a secret word's stem
# anywhere (camelCase has no separator); is_secret_key then decides.
_QUOTED = r"'[^'\n]*'|\"[^\"\n]*\""
_STEM = r"pass(?:w(?:or)?d|phrase)|pwd|token|secret|credential|api[_-]?key|private[_-]?key|access[_-]?key"
_PAIR = re.compile(
    rf"(?<![\w.\-])(?P<key>(?:[\w\-]+\.)*[\w\-]*?(?:{_STEM})[\w\-]*)(?P<close>['\"]?)"
    rf"(?:(?P<eq>=)(?P<v1>{_QUOTED}|[^\s'\"]+)|(?P<colon>[ \t]*:[ \t]*)(?P<v2>{_QUOTED}|[^\s,}}\]'\"]+))",
    re.IGNORECASE,
)
# The password of a URI's userinfo: scheme://user:PASSWORD@host, the userinfo up to the last `@`
# before the path (the user may hold `@` too: an e-mail address).
# Hydra's override_dirname escapes the colons (`http\\://alice\\:PASS@host`).
_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][\w+.\-]*\\?://[^\s:/\\]*\\?:)(?P<password>[^\s/]+)@")
# The words whose plural is made singular before a key is judged.
_SINGULARS = {*SECRET_WORDS, "key"}
# camelCase boundaries: accessToken -> access Token, APIKey -> API Key.
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def key_words(part: str) -> list[str]:
    """A key's words: split at `_`, `-`, `.` and camelCase, lower case, a secret word's plural made
    singular (`clientSecrets` -> client, secret)."""
    words = [w for w in re.split(r"[_\-.\s]+", _CAMEL.sub(" ", part).lower()) if w]
    return [w[:-1] if w.endswith("s") and w not in COUNTING_PLURALS and w[:-1] in _SINGULARS else w for w in words]


def is_secret_key(key: str) -> bool:
    """True for a (dotted) config key whose last part names a secret (an id of one does not)."""
    words = key_words(str(key).rsplit(".", 1)[-1])
    if not words or words[-1] in ("id", "ids"):
        return False
    return any(w in SECRET_WORDS for w in words) or any(pair in SECRET_PAIRS for pair in zip(words, words[1:]))


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
