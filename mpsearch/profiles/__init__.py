"""Hardware profiles: the frozen types, the YAML schema, the shipped-profile lookup."""

from __future__ import annotations

from mpsearch.profiles._cpu import (
    AUTO_X86_PROFILE,
    Int8Isa,
    check_profile_for_cpu,
    host_int8_isa,
    measures_latency,
    x86_profile_for,
)
from mpsearch.profiles._schema import (
    list_shipped,
    read_profile,
    resolve_profile,
    shipped_profile_path,
)
from mpsearch.profiles._types import (
    ACTIVATION_DTYPES,
    BIAS_DTYPES,
    EXECUTES,
    FALLBACKS,
    GRANULARITIES,
    SCALES,
    SCHEMA_VERSION,
    TOOLCHAIN_SETTINGS,
    WEIGHT_DTYPES,
    Format,
    HardwareProfile,
    NodeLike,
    OpRule,
    TensorFormat,
    ToolchainRef,
    list_profiles,
    load_profile,
    validate_profile_file,
)

__all__ = [
    "ACTIVATION_DTYPES",
    "AUTO_X86_PROFILE",
    "BIAS_DTYPES",
    "EXECUTES",
    "FALLBACKS",
    "Format",
    "GRANULARITIES",
    "HardwareProfile",
    "Int8Isa",
    "NodeLike",
    "OpRule",
    "SCALES",
    "SCHEMA_VERSION",
    "TOOLCHAIN_SETTINGS",
    "TensorFormat",
    "ToolchainRef",
    "WEIGHT_DTYPES",
    "check_profile_for_cpu",
    "host_int8_isa",
    "list_profiles",
    "list_shipped",
    "load_profile",
    "measures_latency",
    "read_profile",
    "resolve_profile",
    "shipped_profile_path",
    "validate_profile_file",
    "x86_profile_for",
]
