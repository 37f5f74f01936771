"""The router's own loader for its configuration file (YAML, camelCase; the model is
`protocol.router_config.RouterConfig`)."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from ..protocol.router_config import RouterConfig


class ConfigError(ValueError):
    """The configuration file is missing, not YAML, or not a valid router configuration."""


def parse_config(text: str, source: str = "<config>") -> RouterConfig:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML: {error}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: a router configuration is a YAML mapping")
    try:
        return RouterConfig.model_validate(document)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in error.errors())
        raise ConfigError(f"{source}: {problems}") from None


def load_config(path: str | Path) -> RouterConfig:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(f"cannot read the router configuration {path}: "
                          f"{error.strerror}") from None
    return parse_config(text, str(path))

