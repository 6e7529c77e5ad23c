"""The command line's keys and group options, checked against conf/ before Hydra composes anything.

Hydra's own refusal of an unknown key suggests appending it (`+train.max_step=3`), which it then
accepts and nothing reads; an unknown option in a sweep list (`precision=fp32,bf61`) fails only when
its combination is composed, after the ones before it ran. Both are refused here, every mistake of
the command line at once, one line each with the closest known key or option.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType

from ghsweep.config.keys import closest, did_you_mean, is_known, options, sections
from ghsweep.tracking import redact

# Value kinds whose options can be listed without composing (not glob(), which asks Hydra's loader).
LISTED = (ValueType.ELEMENT, ValueType.SIMPLE_CHOICE_SWEEP, ValueType.CHOICE_SWEEP, ValueType.RANGE_SWEEP)


def refusals(overrides: list[str]) -> list[str]:
    """One line per override that names a key conf/ does not have or an option its group lacks."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    text = " ".join(overrides)
    searched = searched_folders(parsed)
    lines = []
    for override, typed in zip(parsed, overrides):
        name = override.key_or_group
        if override.is_delete() or (name == "hydra" or name.startswith(("hydra.", "hydra/"))) and not options(name):
            continue  # Hydra checks its own tree, all but the launch profiles and sweepers of conf/; `~key` removes
        shown = redact.override(typed)
        if options(name):
            if searched is None:
                continue  # a search path ghsweep cannot look into may add options: Hydra judges them
            lines += _option_refusals(override, name, shown, searched)
        elif not is_known(name) and not _added_on_purpose(override, name, text):
            lines.append(_key_refusal(override, name, shown))
    return lines


def searched_folders(parsed: list[Override]) -> list[Path] | None:
    """The folders the command line adds to Hydra's search path (`hydra.searchpath=[file://DIR]`), whose
    group options (a site's launch profile) are as real as conf/'s; None where one is not a folder
    (`pkg://`), whose options only Hydra can list."""
    folders: list[Path] = []
    for override in parsed:
        if override.key_or_group != "hydra.searchpath" or override.is_delete():
            continue
        value = override.value()
        for entry in value if isinstance(value, list) else [value]:
            if not str(entry).startswith("file://"):
                return None
            folders.append(Path(str(entry).removeprefix("file://")))
    return folders


def _option_refusals(override: Override, group: str, shown: str, searched: list[Path]) -> list[str]:
    if override.value_type not in LISTED or override.value() is None:
        return []
    values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [str(override.value())]
    added = {p.stem for folder in searched for p in (folder / group).glob("*.yaml")}
    accepted = sorted({*options(group), *added})
    if group.startswith("hydra/") and not set(values) <= set(accepted):
        accepted = sorted({*accepted, *hydra_options(group)})
    lines = []
    for value in values:
        if value not in accepted:
            near = closest(value, accepted)
            hint = f"; did you mean {group}={near}?" if near else ""
            lines.append(f"{shown}: {group} has no option {value}; accepted: {', '.join(accepted)}{hint}")
    return lines


def hydra_options(group: str) -> list[str]:
    """The options Hydra and its plugins have for one of its groups: those they register
    (hydra/launcher's `basic`, `submitit_slurm`; hydra/sweeper's `basic`) and the files Hydra ships
    (hydra/job_logging's `default`, `disabled`): asked only for a value that conf/ lacks, as finding
    the plugins takes seconds."""
    import hydra
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # registers each plugin's configs
    try:
        stored = ConfigStore.instance().list(group)
    except OSError:  # no plugin registers any: the group's options are Hydra's files alone
        stored = []
    shipped = [p.name for p in (Path(hydra.__file__).parent / "conf" / group).glob("*.yaml")]
    return sorted({name.removesuffix(".yaml") for name in (*stored, *shipped)})


def _added_on_purpose(override: Override, key: str, command_line: str) -> bool:
    """A key appended with `+` that is meant to be there: a secret (for `${...}` elsewhere to read),
    one the command line reads through `${key}`, or one in a section of the user's own (`+notes.a=`),
    not one of ghsweep's sections or a near miss of one (`+trian.max_steps=`)."""
    if not (override.is_add() or override.is_force_add()):
        return False
    if redact.is_secret_key(key) or "${" + key + "}" in command_line:
        return True
    section = key.split(".", 1)[0]
    return section not in sections() and closest(section, sorted(sections()), cutoff=0.8) is None


def _key_refusal(override: Override, key: str, shown: str) -> str:
    if override.is_add() or override.is_force_add():
        return f"{shown}: {key} is not a key ghsweep reads, so it would be ignored{did_you_mean(key)}"
    value = None if override.is_sweep_override() else str(override.value())
    return f"{shown}: no such key{did_you_mean(key, value)}"
