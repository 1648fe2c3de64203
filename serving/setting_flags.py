"""The daemon's settings as command-line flags: one flag per setting, its help, type, choices and
default read from serving/settings.py, so no command repeats a default."""

from __future__ import annotations

import argparse
from dataclasses import Field, fields

from policies.knobs import KNOB_SPECS, Knobs
from engine.slo_class import SloClass
from serving.settings import KNOB_FLAGS, SLO_FLAGS, Settings, default_of, flags, repeatable, value_type

SETTINGS: dict[str, Field] = {f.name: f for f in fields(Settings)}
DAEMON_URL = f"http://{SETTINGS['host'].default}:{SETTINGS['port'].default}"   # where clients find a default daemon


def add_setting_flag(p: argparse.ArgumentParser, name: str, *, override: bool = False) -> None:
    """The flag of setting `name`. `override`: it defaults to None, leaving the config file's value
    (or the setting's default) alone; else to the setting's default, for commands that read no file."""
    f = SETTINGS[name]
    default = None if override else f.default
    if f.type == "bool":
        state = "on by default; this flag turns it off" if f.default else "off by default"
        p.add_argument(flags(f)[0], dest=name, action="store_const", const=not f.default,
                       default=default, help=f"{f.metadata['help']} ({state})")
        return
    if repeatable(f):   # each use adds one value (None: none given, the file's or the default list stands)
        p.add_argument(flags(f)[0], dest=name, type=value_type(f), action="append",
                       default=None if override else list(default_of(Settings, name)), help=f.metadata["help"])
        return
    shown = "" if f.default is None else f" (default {f.default})"   # the help says what null means
    p.add_argument(flags(f)[0], type=value_type(f), default=default, choices=f.metadata["choices"] or None,
                   help=f.metadata["help"] + shown)


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """Every setting as a flag overriding the config file."""
    p.add_argument("--config", default=None, help="YAML settings file (see configs/default.yaml)")
    for name in SETTINGS:
        if name == "knobs":
            add_knob_flags(p)
        elif name == "slo":
            add_slo_flags(p, override=True)
        else:
            add_setting_flag(p, name, override=True)


def add_knob_flags(p: argparse.ArgumentParser) -> None:
    for knob in KNOB_FLAGS:
        p.add_argument(f"--{knob.replace('_', '-')}", type=int, default=None,
                       help=f"knob: {KNOB_SPECS[knob].help} (default {getattr(Knobs(), knob)})")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                   help="any knob's value (repeatable; `autotuned-serve policies` lists them)")


def add_slo_flags(p: argparse.ArgumentParser, *, override: bool = False) -> None:
    """--slo-ttft-s and --slo-tbt-s (SLO_FLAGS). `override`: the serve flags, None unless given (the
    default class of --slo-classes keeps its targets); else the targets a command judges requests by,
    defaulting to the default SLO class's."""
    for target in SLO_FLAGS:
        default = None if override else default_of(SloClass, target)
        shown = "--slo-classes' default class" if override else "%(default)s"
        p.add_argument(f"--slo-{target.replace('_', '-')}", dest=f"slo_{target}", type=float, default=default,
                       help=f"the {'default SLO class' if override else 'SLO'}'s {target} bound (default {shown})")


def parse_knobs(pairs: list[str]) -> dict[str, object]:
    """NAME=VALUE pairs with each value typed by its knob's spec."""
    knobs: dict[str, object] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in KNOB_SPECS:
            raise ValueError(f"--knob {pair!r}: expected NAME=VALUE with NAME one of {', '.join(KNOB_SPECS)}")
        kind = KNOB_SPECS[name].kind
        try:
            knobs[name] = kind(float(value)) if kind is int else kind(value)
        except ValueError:
            raise ValueError(f"--knob {pair!r}: {value!r} is not a {kind.__name__}") from None
    return knobs


def knob_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The knobs set by --knob and the knobs' own flags (these win)."""
    knobs = parse_knobs(args.knob)
    return knobs | {k: getattr(args, k) for k in KNOB_FLAGS if getattr(args, k, None) is not None}


def serve_overrides(args: argparse.Namespace) -> dict:
    """The settings the serve flags set (None: left to the config file or the default)."""
    overrides = {name: getattr(args, name) for name in SETTINGS if name not in ("knobs", "slo")}
    slo = {k: getattr(args, f"slo_{k}") for k in SLO_FLAGS if getattr(args, f"slo_{k}") is not None}
    return overrides | {"knobs": knob_overrides(args), "slo": slo}
