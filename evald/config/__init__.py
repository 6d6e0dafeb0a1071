"""evald's configuration: one definition of every option (options.py), one validator for
every source (schema.py), the sources (sources.py) and their merge (resolve.py).

docs/configuration.md has the table, generated from options.py. ``values.py`` and
``health_thresholds.py`` are the option types with structure (devices, --min-delta, health).

May import: contracts.
"""

from __future__ import annotations

from evald.config.options import ANNOUNCED, EvaldConfig, GenerationOptions, ServeOptions, TuningOptions, option_fields
from evald.config.resolve import ResolvedConfig, resolve, with_announcement
from evald.config.schema import ConfigError, default_of, flag_of
from evald.config.sources import Layer, command_line_layer, environment_layer, toml_layer
from evald.config.values import DeviceSpec
from evald.contracts.wire import FactorySpec


def factory_spec(config: EvaldConfig, which: str) -> FactorySpec | None:
    """The model or data factory as the wire contract's FactorySpec, or None when unknown."""
    target = getattr(config, f"{which}_factory")
    if not target:
        return None
    return FactorySpec(target, dict(getattr(config, f"{which}_kwargs") or {}), config.app_dir)


__all__ = ["ANNOUNCED", "ConfigError", "DeviceSpec", "EvaldConfig", "GenerationOptions", "Layer",
           "ResolvedConfig", "ServeOptions", "TuningOptions", "command_line_layer", "default_of", "environment_layer",
           "factory_spec", "flag_of", "option_fields", "resolve", "toml_layer", "with_announcement"]
