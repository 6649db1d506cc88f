"""The typed configuration and reading it.

`rlshell.config.schema` declares one attrs frozen class per component (their
fields, defaults and per-field constraints); `rlshell.config.loading` reads a
config file or a resolved ``config.json``, applies ``key.path=value``
overrides and structures the result with cattrs. Both are re-exported here:

    from rlshell.config import Config, ConfigError, read_config

The rules between fields, the registries and the placement are checked one
layer up, by `rlshell.runners.validation` (``load_config`` reads and
validates in one call).

With ``RLSHELL_TRACE_CONFIG_READS=<dir>`` set, importing this package also
installs `rlshell.config.tracing`, which records the key paths each process
reads (docs/config.md, "Which keys did my run read?").
"""

import os as _os

from rlshell.config.loading import (
    CONVERTER,
    ConfigError,
    all_key_paths,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    parse_override_value,
    read_config,
    read_config_source,
    write_config,
)
from rlshell.config.schema import (
    CHECK_KEY,
    COMPONENTS,
    WORKER_MALLOC_ENV,
    ActorConfig,
    AgentConfig,
    AlgorithmConfig,
    CheckpointConfig,
    ClusterConfig,
    Config,
    CriticConfig,
    CriticOptimConfig,
    DataConfig,
    EnvConfig,
    FSDPConfig,
    LoggerConfig,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
    PlacementEntry,
    Precision,
    RewardConfig,
    RolloutConfig,
    RunnerConfig,
    SACConfig,
    WrapPolicyConfig,
    checked,
    field_problems,
)
from rlshell.config.tracing import TRACE_ENV_VAR
from rlshell.config.tracing import install as install_read_tracer

__all__ = [
    "CHECK_KEY",
    "COMPONENTS",
    "CONVERTER",
    "TRACE_ENV_VAR",
    "WORKER_MALLOC_ENV",
    "ActorConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "CriticConfig",
    "CriticOptimConfig",
    "DataConfig",
    "EnvConfig",
    "FSDPConfig",
    "LoggerConfig",
    "MegatronConfig",
    "ModelConfig",
    "OptimConfig",
    "PlacementEntry",
    "Precision",
    "RewardConfig",
    "RolloutConfig",
    "RunnerConfig",
    "SACConfig",
    "WrapPolicyConfig",
    "all_key_paths",
    "apply_overrides",
    "checked",
    "config_from_dict",
    "config_to_dict",
    "field_problems",
    "install_read_tracer",
    "parse_override_value",
    "read_config",
    "read_config_source",
    "write_config",
]

if _os.environ.get(TRACE_ENV_VAR):
    install_read_tracer(_os.environ[TRACE_ENV_VAR])
